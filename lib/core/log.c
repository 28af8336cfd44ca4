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

/* Control bytes become \xHH, as nginx writes them in its logs: a message carries text from
 * agents and upstreams, and a newline in it must not start a line that looks like another
 * entry (log forging). Returns the escaped length; out holds cap bytes. */
static size_t log_escape(const char *in, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < cap; p++) {
        if (*p < 0x20 || *p == 0x7f) {
            out[o++] = '\\', out[o++] = 'x', out[o++] = hex[*p >> 4], out[o++] = hex[*p & 15];
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
    return o;
}

void al_log_write(int level, const char *component, const char *fmt, ...)
{
    static const char *tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    char raw[2048], msg[2048 * 4 + 8];
    struct timeval tv;
    struct tm tm;
    char ts[32];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    log_escape(raw, msg, sizeof msg);
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    if (level < 0) level = 0;
    if (level > 3) level = 3;
    fprintf(stderr, "%s.%03dZ %s %s: %s\n", ts, (int)(tv.tv_usec / 1000), tags[level],
            component ? component : "arclight", msg);
}
