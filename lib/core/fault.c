/*
 * fault.c: the test-only fault points of fault.h (empty unless ARCLIGHT_FAULT_POINTS).
 */
#include "core/fault.h"

#ifdef ARCLIGHT_FAULT_POINTS

#include "core/log.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *al_fault_spec(const char *var)
{
    const char *v = getenv(var);
    return v && *v ? v : NULL;
}

void al_fault_kill(const char *comp, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    al_log_warn(comp, "test fault point: SIGKILL %s", what);
    raise(SIGKILL);
    _exit(137); /* not reached: SIGKILL cannot be caught */
}

#else
typedef int al_fault_points_disabled; /* ISO C wants a translation unit to declare something */
#endif
