/*
 * log.h: leveled logging to stderr, one line per event:
 *   2026-11-29T18:49:09.123Z INFO  broker: listening on 127.0.0.1:9092
 * The level comes from --log-level or $ARCLIGHT_LOG_LEVEL (error, warn, info, debug).
 * Thread-safe: each line is written with one fprintf under stderr's lock.
 */
#ifndef ARCLIGHT_LOG_H
#define ARCLIGHT_LOG_H

enum al_log_level {
    AL_LOG_LEVEL_ERROR = 0,
    AL_LOG_LEVEL_WARN = 1,
    AL_LOG_LEVEL_INFO = 2,
    AL_LOG_LEVEL_DEBUG = 3,
};

extern int al_log_level_current;

/* Parses "error|warn|info|debug"; returns -1 for anything else. */
int al_log_level_parse(const char *s);
void al_log_set_level(int level);
/* Sets the level from $ARCLIGHT_LOG_LEVEL when it is set and valid. */
void al_log_init_from_env(void);

void al_log_write(int level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define AL_LOG(level, comp, ...)                                                                   \
    do {                                                                                           \
        if ((level) <= al_log_level_current) al_log_write((level), (comp), __VA_ARGS__);           \
    } while (0)
#define al_log_error(comp, ...) AL_LOG(AL_LOG_LEVEL_ERROR, comp, __VA_ARGS__)
#define al_log_warn(comp, ...) AL_LOG(AL_LOG_LEVEL_WARN, comp, __VA_ARGS__)
#define al_log_info(comp, ...) AL_LOG(AL_LOG_LEVEL_INFO, comp, __VA_ARGS__)
#define al_log_debug(comp, ...) AL_LOG(AL_LOG_LEVEL_DEBUG, comp, __VA_ARGS__)

#endif
