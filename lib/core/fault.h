/*
 * fault.h: test-only fault points. A test names a spot in an environment variable
 * (ARCLIGHT_BATCH_TEST_KILL_AT=3:-1, ARCLIGHT_TRAIN_TEST_KILL_AT=2:ack, ...) and the stage
 * dies there with SIGKILL, as `kill -9` would kill it at that instant: no flush, no commit,
 * no exit handler. Each stage parses its own variable's value.
 *
 * Fault points exist only in builds configured with ARCLIGHT_FAULT_POINTS (a CMake option,
 * ON by default in the sanitizer build that scripts/test.sh runs the tests on, OFF
 * otherwise). Elsewhere al_fault_spec is the constant NULL and al_fault_kill nothing at all,
 * so the variable names are never compiled in, the environment is never read, and every
 * branch that would kill is dead code: a release binary holds no fault point (scripts/test.sh
 * checks that build/arclight contains none of the variables' names).
 *
 *   const char *at = al_fault_spec("ARCLIGHT_BATCH_TEST_KILL_AT");     // NULL: not set
 *   if (at && sscanf(at, "%" SCNd64, &kill_step) != 1) kill_step = -1;
 *   ...
 *   if (AL_FAULT_POINTS && step == kill_step) al_fault_kill("batch", "after step %d", step);
 */
#ifndef ARCLIGHT_CORE_FAULT_H
#define ARCLIGHT_CORE_FAULT_H

#ifdef ARCLIGHT_FAULT_POINTS
#define AL_FAULT_POINTS 1

/* The value of environment variable `var` (a fault point's spot), NULL when unset or
 * empty. */
const char *al_fault_spec(const char *var);

/* Logs "test fault point: SIGKILL <what>" (a warning of component comp) and kills the
 * process with SIGKILL. Does not return. */
void al_fault_kill(const char *comp, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));

#else
#define AL_FAULT_POINTS 0
#define al_fault_spec(var) ((const char *)0)
#define al_fault_kill(...) ((void)0)
#endif

#endif
