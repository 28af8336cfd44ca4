/*
 * broker_bind.c: where the embedded broker's listeners go (see broker_bind.h).
 *
 * librdkafka 2.0.2's mock cluster binds each broker's listener to 127.0.0.1 port 0 (an
 * ephemeral port) in rd_kafka_mock_broker_new_listener and has no way to choose one: no
 * configuration property, no argument of rd_kafka_mock_cluster_new, and the listener is
 * made with rd_kafka_socket_cb_linux directly (not the configurable socket_cb). The port it
 * binds is the port it advertises (bootstrap servers, Metadata), so the socket cannot be
 * swapped afterwards either. The one place to act is the bind(2) call itself. So that
 * `--listen 127.0.0.1:9092` means what it says, this file points librdkafka's own GOT entry
 * for bind at a hook for the duration of rd_kafka_mock_cluster_new (which creates every
 * listener in the calling thread), and back afterwards. Only librdkafka's calls, and only
 * while `arclight broker` creates its cluster, see the hook; every other command, and every
 * other bind of this one, calls libc directly. (A definition of bind in the executable would
 * do the same by symbol interposition, but for every bind of every command of the binary.)
 *
 * The hook also turns Nagle's algorithm off on those listeners (TCP_NODELAY, which the
 * connections they accept inherit on Linux). The mock cluster leaves it on, so a short
 * answer sent while the client's acknowledgement of the previous one is delayed waited for
 * it: 40 ms at the end of a stream of produce requests (bench_credit's last transitions).
 *
 * Finding the entry: librdkafka is a shared library; its dynamic section lists its
 * relocations (PLT and data), one of which names the symbol bind and says where the address
 * lives. Built with full RELRO (Debian's is: BIND_NOW), that page is read-only after loading:
 * it is made writable for the one store and read-only again.
 */
#define _GNU_SOURCE
#include "broker_bind.h"

#include "core/log.h"

#include <elf.h>
#include <errno.h>
#include <link.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#if UINTPTR_MAX > 0xffffffffu
#define BIND_R_SYM(info) ELF64_R_SYM(info)
#else
#define BIND_R_SYM(info) ELF32_R_SYM(info)
#endif

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static bind_fn *bind_slot; /* librdkafka's GOT entry for bind, while hooked */
static int bind_slot_relro; /* it lies in memory made read-only after relocation */
static bind_fn bind_real;   /* what the entry held: libc's bind (or a sanitizer's) */
static int bind_nodelay_count; /* listeners that got TCP_NODELAY */
static int bind_fixed_active;
static struct in_addr bind_fixed_addr;
static int bind_fixed_next_port; /* 0: keep the ephemeral port, change the address only */
static int bind_fixed_count;

/* librdkafka's bind while hooked: TCP_NODELAY on a TCP listener; with rewrite, a loopback
 * port-0 bind goes to the requested address and the next port of the range. */
static int bind_hooked(int fd, const struct sockaddr *addr, socklen_t len)
{
    int type = 0;
    socklen_t tlen = sizeof type;
    if (addr && addr->sa_family == AF_INET &&
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM) {
        int one = 1;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0)
            bind_nodelay_count++;
        else
            al_log_warn("broker", "TCP_NODELAY on a listener: %s", strerror(errno));
    }
    if (bind_fixed_active && addr && addr->sa_family == AF_INET &&
        len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in sin;
        memcpy(&sin, addr, sizeof sin);
        if (sin.sin_port == 0 && sin.sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
            int one = 1;
            sin.sin_addr = bind_fixed_addr;
            if (bind_fixed_next_port) {
                sin.sin_port = htons((uint16_t)bind_fixed_next_port++);
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            }
            bind_fixed_count++;
            return bind_real(fd, (const struct sockaddr *)&sin, sizeof sin);
        }
    }
    return bind_real(fd, addr, len);
}

typedef struct slot_search {
    bind_fn *slot;
    int relro;
} slot_search;

/* A dynamic-section address: glibc stores them relocated, other loaders as offsets. */
static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) v)
{
    return v < base ? base + v : v;
}

/* dl_iterate_phdr callback: in librdkafka, the relocation of the symbol bind (its PLT
 * entry, or a GOT entry when built without a PLT); sets *data's slot. 1 stops the walk. */
static int slot_find(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    slot_search *s = data;
    const char *file = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    file = file ? file + 1 : info->dlpi_name;
    if (!file || strncmp(file, "librdkafka.so", 13) != 0) return 0;
    uintptr_t base = info->dlpi_addr, relro_lo = 0, relro_hi = 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = base + ph->p_vaddr;
            relro_hi = relro_lo + ph->p_memsz;
        }
    }
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *rel[2] = {NULL, NULL}; /* the PLT's, the rest */
    size_t relsz[2] = {0, 0};
    ElfW(Sxword) pltrel = DT_RELA;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB:
            symtab = (const ElfW(Sym) *)dyn_addr(base, dyn->d_un.d_ptr);
            break;
        case DT_STRTAB:
            strtab = (const char *)dyn_addr(base, dyn->d_un.d_ptr);
            break;
        case DT_JMPREL:
            rel[0] = (const ElfW(Rela) *)dyn_addr(base, dyn->d_un.d_ptr);
            break;
        case DT_PLTRELSZ:
            relsz[0] = dyn->d_un.d_val;
            break;
        case DT_RELA:
            rel[1] = (const ElfW(Rela) *)dyn_addr(base, dyn->d_un.d_ptr);
            break;
        case DT_RELASZ:
            relsz[1] = dyn->d_un.d_val;
            break;
        case DT_PLTREL:
            pltrel = (ElfW(Sxword))dyn->d_un.d_val;
            break;
        }
    }
    if (!symtab || !strtab || pltrel != DT_RELA) return 1; /* REL-only targets: not handled */
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; rel[t] && i < relsz[t] / sizeof *rel[t]; i++) {
            size_t sym = BIND_R_SYM(rel[t][i].r_info);
            if (!sym || strcmp(strtab + symtab[sym].st_name, "bind") != 0) continue;
            s->slot = (bind_fn *)(base + rel[t][i].r_offset);
            s->relro = (uintptr_t)s->slot >= relro_lo && (uintptr_t)s->slot < relro_hi;
            return 1;
        }
    return 1;
}

/* Stores fn in the slot, opening a read-only page for the store. 0 or -1 (errno). */
static int slot_store(bind_fn *slot, int relro, bind_fn fn)
{
    long pg = sysconf(_SC_PAGESIZE);
    void *page = (void *)((uintptr_t)slot & ~((uintptr_t)pg - 1));
    if (relro && mprotect(page, (size_t)pg, PROT_READ | PROT_WRITE) != 0) return -1;
    __atomic_store_n(slot, fn, __ATOMIC_SEQ_CST);
    if (relro) mprotect(page, (size_t)pg, PROT_READ);
    return 0;
}

int broker_bind_hook_install(struct in_addr addr, int first_port, int rewrite, char *errstr,
                             size_t errlen)
{
    slot_search s = {NULL, 0};
    dl_iterate_phdr(slot_find, &s);
    if (!s.slot) {
        snprintf(errstr, errlen,
                 "librdkafka's bind(2) entry not found (librdkafka not a shared library?)");
        return -1;
    }
    bind_real = *s.slot;
    bind_fixed_addr = addr;
    bind_fixed_next_port = first_port;
    bind_fixed_count = 0;
    bind_nodelay_count = 0;
    bind_fixed_active = rewrite;
    if (slot_store(s.slot, s.relro, bind_hooked) != 0) {
        snprintf(errstr, errlen, "librdkafka's bind(2) entry: mprotect: %s", strerror(errno));
        bind_fixed_active = 0;
        return -1;
    }
    bind_slot = s.slot;
    bind_slot_relro = s.relro;
    return 0;
}

void broker_bind_hook_remove(int *nodelay_count, int *fixed_count)
{
    if (bind_slot && slot_store(bind_slot, bind_slot_relro, bind_real) != 0)
        al_log_warn("broker", "librdkafka's bind(2) entry stays hooked: %s", strerror(errno));
    bind_slot = NULL;
    bind_fixed_active = 0;
    *nodelay_count = bind_nodelay_count;
    *fixed_count = bind_fixed_count;
}
