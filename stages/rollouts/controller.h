/*
 * controller.h: the rollout controller's decisions that need no processes or Kafka, so
 * that tests can drive them: pacing on the trainer, reading an agent's reward line, the
 * proxy URLs a rollout is given.
 */
#ifndef ARCLIGHT_ROLLOUTS_CONTROLLER_H
#define ARCLIGHT_ROLLOUTS_CONTROLLER_H

#include <stddef.h>
#include <stdint.h>

/* Pacing (on-policy with staleness 0): a trainer step takes step_groups groups. Starting at
 * policy version v0, the groups that feed the update to version v0 + k + 1 are the k-th
 * step_groups ones; rollouts may run at most max_staleness versions ahead of the trainer,
 * so with the trainer at version v the controller may have started
 *     (v - v0 + 1 + max_staleness) * step_groups + lost
 * training groups, where `lost` counts groups that will never reach the trainer (every
 * rollout of them failed: credit drops such a group). 1 when one more group may start. */
int rl_pace_may_start(int64_t v, int64_t v0, int64_t max_staleness, int64_t step_groups,
                      int64_t started, int64_t lost);

/* The reward line an agent may print last on stdout: a JSON object with a finite number
 * "reward" (within +-1e15), and optionally "rewards": {name: number}. 1 with the values
 * (the whole object, compact, in body: what the controller posts to the proxy), 0 when the
 * line is not a reward line at all (no "reward" member or not an object), -1 when it looks
 * like one but is malformed (reason in errstr: the rollout is then failed). */
int rl_parse_reward_line(const char *line, double *reward, char *body, size_t bodylen,
                         char *errstr, size_t errlen);

/* The base URLs of one rollout: prefix is the proxy URL (no trailing slash). Training:
 * PREFIX/r/{task}/{rollout}[/{attempt}] (the attempt only when > 0); evaluation:
 * PREFIX/e/{task}/{rollout}[/{attempt}] at temperature 0, PREFIX/e:T/... otherwise.
 * OpenAI clients get base + "/v1", Anthropic clients the base itself. */
void rl_rollout_base(char *out, size_t outlen, const char *proxy, int eval, double eval_temp,
                     const char *task, const char *rollout, int attempt);

#endif
