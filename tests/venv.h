/*
 * venv.h: where the tests find scripts/setup.sh's Python virtual environment (the Python
 * agents' clients, tensorboard's reader): $ARCLIGHT_VENV, else ~/.cache/arclight/venv. A
 * test that needs it and finds none says so and exits 77, which its ctest registration
 * (SKIP_RETURN_CODE 77) reports as skipped, never as passed. Header-only (static).
 */
#ifndef ARCLIGHT_TESTS_VENV_H
#define ARCLIGHT_TESTS_VENV_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The venv's python into out (an absolute path); exits 77 with a message when there is
 * none, or when it lacks a module the test needs (modules: space-separated). */
static inline void al_test_venv_python(char *out, size_t n, const char *modules)
{
    const char *venv = getenv("ARCLIGHT_VENV"), *home = getenv("HOME");
    if (venv && *venv)
        snprintf(out, n, "%s/bin/python", venv);
    else
        snprintf(out, n, "%s/.cache/arclight/venv/bin/python", home ? home : "");
    char cmd[1024];
    int fits = snprintf(cmd, sizeof cmd, "'%s' -c 'import sys; [__import__(m) for m in "
                                         "sys.argv[1:]]' %s >/dev/null 2>&1",
                        out, modules ? modules : "") < (int)sizeof cmd;
    if (!fits || access(out, X_OK) || system(cmd)) {
        printf("skipped: no Python virtual environment with %s at %s (run bash "
               "scripts/setup.sh, or set ARCLIGHT_VENV)\n",
               modules ? modules : "python", out);
        fflush(stdout);
        exit(77);
    }
}

#endif
