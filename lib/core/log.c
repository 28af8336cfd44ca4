#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

int al_log_level_current = AL_LOG_LEVEL_INFO;

static const char *level_names[] = {"error", "warn", "info", "debug"};

int al_log_level_parse(const char *s)
{
    if (!s) return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(s, level_names[i]) == 0) return i;
    if (strcmp(s, "warning") == 0) return AL_LOG_LEVEL_WARN;
    return -1;
}

void al_log_set_level(int level)
{
    if (level >= AL_LOG_LEVEL_ERROR && level <= AL_LOG_LEVEL_DEBUG) al_log_level_current = level;
}

void al_log_init_from_env(void)
{
    int l = al_log_level_parse(getenv("ARCLIGHT_LOG_LEVEL"));
    if (l >= 0) al_log_level_current = l;
}

void al_log_write(int level, const char *component, const char *fmt, ...)
{
    static const char *tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    char msg[2048];
    struct timeval tv;
    struct tm tm;
    char ts[32];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    if (level < 0) level = 0;
    if (level > 3) level = 3;
    fprintf(stderr, "%s.%03dZ %s %s: %s\n", ts, (int)(tv.tv_usec / 1000), tags[level],
            component ? component : "arclight", msg);
}
