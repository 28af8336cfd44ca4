/*
 * backend.c: choosing a backend. The CUDA backend is a module of its own
 * (libarclight_cuda.so, lib/model/cuda), opened with dlopen when asked for, so that nothing
 * that runs on the CPU links or loads CUDA, cuBLAS, cuDNN or NCCL (500+ MB of libraries
 * that every test process would otherwise map at start).
 */
#define _GNU_SOURCE
#include "model/ops.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef al_backend *(*cuda_new_fn)(char *errstr, size_t errlen);
typedef int (*cuda_count_fn)(void);

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static void *cuda_module;
static char cuda_module_err[512];

/* Looks for the module: $ARCLIGHT_CUDA_BACKEND (a path), beside the executable, the build
 * tree it was built in, then the loader's own search (LD_LIBRARY_PATH, rpath). */
static void cuda_load(void)
{
#ifdef ARCLIGHT_CUDA_MODULE
    const char *name = ARCLIGHT_CUDA_MODULE;
    char tried[3][PATH_MAX + 64];
    int nt = 0;
    const char *env = getenv("ARCLIGHT_CUDA_BACKEND");
    if (env && *env) snprintf(tried[nt++], sizeof tried[0], "%s", env);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(tried[nt++], sizeof tried[0], "%s/%s", exe, name);
    }
#ifdef ARCLIGHT_CUDA_MODULE_DIR
    snprintf(tried[nt++], sizeof tried[0], "%s/%s", ARCLIGHT_CUDA_MODULE_DIR, name);
#endif
    char first_err[256] = "";
    for (int i = 0; i < nt && !cuda_module; i++) {
        if (access(tried[i], F_OK) != 0) continue;
        cuda_module = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
        if (!cuda_module && !first_err[0]) snprintf(first_err, sizeof first_err, "%s", dlerror());
    }
    if (!cuda_module) cuda_module = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!cuda_module)
        snprintf(cuda_module_err, sizeof cuda_module_err,
                 "device cuda: cannot load the CUDA backend module %s: %s", name,
                 first_err[0] ? first_err : dlerror());
#else
    snprintf(cuda_module_err, sizeof cuda_module_err,
             "device cuda: this build has no CUDA backend (configure where nvcc, cuBLAS, cuDNN "
             "and NCCL are; see README)");
#endif
}

static void *cuda_sym(const char *sym)
{
    pthread_once(&cuda_once, cuda_load);
    return cuda_module ? dlsym(cuda_module, sym) : NULL;
}

int al_backend_cuda_built(void)
{
#ifdef ARCLIGHT_CUDA_MODULE
    return 1;
#else
    return 0;
#endif
}

int al_backend_cuda_available(void)
{
    if (!al_backend_cuda_built()) return 0;
    /* No NVIDIA driver on this machine: say so without mapping the module's libraries
     * (hundreds of MB), which every CPU run choosing "auto" would otherwise pay for. */
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/proc/driver/nvidia/version", F_OK) != 0 &&
        !getenv("ARCLIGHT_CUDA_BACKEND"))
        return 0;
    cuda_count_fn f = (cuda_count_fn)cuda_sym("al_backend_cuda_device_count");
    return f ? f() > 0 : 0;
}

void *al_backend_cuda_symbol(const char *name)
{
    return cuda_sym(name);
}

const char *al_backend_cuda_load_error(void)
{
    if (!al_backend_cuda_built()) return NULL;
    pthread_once(&cuda_once, cuda_load);
    return cuda_module ? NULL : cuda_module_err;
}

al_backend *al_backend_open(const char *name, char *errstr, size_t errlen)
{
    if (!name || !strcmp(name, "cpu")) return al_backend_cpu();
    int is_auto = !strcmp(name, "auto");
    if (strcmp(name, "cuda") != 0 && !is_auto) {
        snprintf(errstr, errlen, "unknown device '%s' (expected cuda, cpu or auto)", name);
        return NULL;
    }
    if (is_auto && !al_backend_cuda_available()) return al_backend_cpu();
    cuda_new_fn f = (cuda_new_fn)cuda_sym("al_backend_cuda_new");
    if (!f) {
        snprintf(errstr, errlen, "%s",
                 cuda_module_err[0] ? cuda_module_err
                                    : "device cuda: the module lacks al_backend_cuda_new");
        return NULL;
    }
    return f(errstr, errlen);
}

void al_backend_free(al_backend *b)
{
    if (b && b->ops->destroy) b->ops->destroy(b);
}
