/* 0006: the layers of docs/ARCHITECTURE.md hold: every #include "..." under lib/, stages/ and
 * tools/ names a folder its file's layer may use (core -> text -> model; core -> avro, http;
 * kafka over avro and http; api over core; stages over lib; tools over lib), no stage includes
 * another stage or tools/, and a bare "x.h" is a header beside the file. */
#include "testlib.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What each layer may include, by the first folder of the include path. */
static const struct {
    const char *dir;     /* the file's folder (prefix) */
    const char *allowed; /* space-separated include folders; "lib" means every lib folder */
} rules[] = {
    {"lib/core/", "core"},
    {"lib/text/", "core text"},
    {"lib/model/", "core text model"},
    {"lib/avro/", "core avro"},
    {"lib/http/", "core http"},
    {"lib/kafka/", "core avro http kafka"},
    {"lib/api/", "core api"},
    {"stages/", "lib"},
    {"tools/", "lib"},
};

static const char *const lib_dirs[] = {"core", "text", "model", "avro", "http", "kafka", "api"};

static char root[2048];
static int violations;

static int word_in(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

static int is_lib_dir(const char *d)
{
    for (size_t i = 0; i < sizeof lib_dirs / sizeof lib_dirs[0]; i++)
        if (!strcmp(d, lib_dirs[i])) return 1;
    return 0;
}

/* Checks one #include "inc" of rel (a path under root). */
static void check_include(const char *rel, int line, const char *inc)
{
    const char *slash = strchr(inc, '/');
    if (!slash) { /* a header beside the file */
        char path[4096];
        const char *dirend = strrchr(rel, '/');
        snprintf(path, sizeof path, "%s/%.*s/%s", root, (int)(dirend - rel), rel, inc);
        struct stat st;
        if (stat(path, &st) != 0) {
            printf("  %s:%d: #include \"%s\" is not beside the file\n", rel, line, inc);
            violations++;
        }
        return;
    }
    char dir[64];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - inc), inc);
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        size_t n = strlen(rules[i].dir);
        if (strncmp(rel, rules[i].dir, n) != 0) continue;
        int ok;
        if (!strcmp(rules[i].allowed, "lib")) {
            ok = is_lib_dir(dir);
            if (!strcmp(rules[i].dir, "stages/")) { /* its own stage's folder too */
                const char *stage = rel + n, *e = strchr(stage, '/');
                if (e && (size_t)(e - stage) == strlen(dir) && !strncmp(stage, dir, strlen(dir)))
                    ok = 1;
            }
        } else {
            ok = word_in(rules[i].allowed, dir);
        }
        if (!ok) {
            printf("  %s:%d: #include \"%s\": %s may not use %s/\n", rel, line, inc,
                   rules[i].dir, dir);
            violations++;
        }
        return;
    }
}

static void scan_file(const char *rel)
{
    char path[4096], buf[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "r");
    if (!f) return;
    int line = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        char *p = buf;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "#include \"", 10) != 0) continue;
        char *q = strchr(p + 10, '"');
        if (!q) continue;
        *q = '\0';
        check_include(rel, line, p + 10);
    }
    fclose(f);
}

static int source_name(const char *n)
{
    const char *dot = strrchr(n, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") ||
                   !strcmp(dot, ".cuh"));
}

/* Scans every source file below rel; returns how many. */
static int scan_tree(const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[2048];
        snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name);
        snprintf(path, sizeof path, "%s/%s", root, sub);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            n += scan_tree(sub);
        } else if (source_name(e->d_name)) {
            scan_file(sub);
            n++;
        }
    }
    closedir(d);
    return n;
}

TEST(every_include_stays_in_its_layer)
{
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(root, sizeof root, "%s", src && *src ? src : ".");
    int files = scan_tree("lib") + scan_tree("stages") + scan_tree("tools");
    CHECKF(files > 100, "only %d source files found under %s", files, root);
    CHECKF(violations == 0, "%d includes cross a layer (listed above)", violations);
}
