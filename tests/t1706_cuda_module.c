/*
 * 1706: choosing a backend, on any machine. Where this build has the CUDA backend, its module
 * (libarclight_cuda.so) must load with every symbol resolved (the loader binds them all at
 * once: a function of a library the module does not link shows here, not on the GPU machine)
 * and export its entry points; without a device, "cuda" is a clear error and "auto" the CPU.
 * Without the CUDA backend, "cuda" says the build has none. Unknown names are refused.
 */
#include "testlib.h"

#include "model/ops.h"

TEST(backend_choice)
{
    char err[512] = "";
    CHECK(al_backend_open("cpu", err, sizeof err) == al_backend_cpu());
    CHECK(al_backend_open("tpu", err, sizeof err) == NULL && strstr(err, "unknown device 'tpu'"));
    al_backend *a = al_backend_open("auto", err, sizeof err);
    REQUIREF(a, "%s", err);
    CHECK(!strcmp(a->ops->name, al_backend_cuda_available() ? "cuda" : "cpu"));
    al_backend_free(a);
    if (!al_backend_cuda_built()) {
        CHECK(al_backend_open("cuda", err, sizeof err) == NULL && strstr(err, "no CUDA backend"));
        printf("    this build has no CUDA backend\n");
        return;
    }
    const char *le = al_backend_cuda_load_error();
    CHECKF(le == NULL, "the CUDA module does not load: %s", le ? le : "");
    if (le) return;
    const char *syms[] = {"al_backend_cuda_new", "al_backend_cuda_device_count",
                          "al_backend_cuda_describe", "al_cuda_nccl_unique_id", "al_cuda_nccl_init",
                          "al_cuda_nccl_allreduce", "al_cuda_nccl_broadcast", "al_cuda_nccl_free"};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        CHECKF(al_backend_cuda_symbol(syms[i]) != NULL, "the CUDA module lacks %s", syms[i]);
    if (!al_backend_cuda_available()) {
        CHECK(al_backend_open("cuda", err, sizeof err) == NULL && strstr(err, "no CUDA device"));
        printf("    CUDA module loaded; no device here (%s)\n", err);
    } else {
        al_backend *b = al_backend_open("cuda", err, sizeof err);
        CHECKF(b && !strcmp(b->ops->name, "cuda"), "%s", err);
        al_backend_free(b);
        printf("    CUDA module loaded; a device is present\n");
    }
}
