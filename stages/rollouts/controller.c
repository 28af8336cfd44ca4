/*
 * controller.c: the rollout controller's pure decisions (see controller.h).
 */
#include "rollouts/controller.h"

#include "avro/codec.h" /* AL_REWARD_MAX */
#include "core/util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rl_pace_may_start(int64_t v, int64_t v0, int64_t max_staleness, int64_t step_groups,
                      int64_t started, int64_t lost)
{
    int64_t ahead = v - v0 + 1 + max_staleness;
    if (ahead < 1) ahead = 1; /* a version older than the start: pace from the start */
    return started < ahead * step_groups + lost;
}

int rl_parse_reward_line(const char *line, double *reward, char *body, size_t bodylen,
                         char *errstr, size_t errlen)
{
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line != '{') return 0;
    json_error_t je;
    json_t *j = json_loads(line, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        /* a line that starts like an object but is not JSON is not a reward line either,
         * unless it names one */
        if (!strstr(line, "\"reward\"")) return 0;
        return al_err(errstr, errlen, "the agent's reward line is not valid JSON: %s", je.text);
    }
    json_t *r = json_object_get(j, "reward"), *rs = json_object_get(j, "rewards");
    if (!r) {
        json_decref(j);
        return 0;
    }
    int rc = -1;
    if (!json_is_number(r) || !(fabs(json_number_value(r)) <= AL_REWARD_MAX)) {
        al_err(errstr, errlen, "the agent's reward line has \"reward\" that is not a finite "
                               "number within +-%g",
               AL_REWARD_MAX);
        goto out;
    }
    if (rs && !json_is_object(rs)) {
        al_err(errstr, errlen, "the agent's reward line has \"rewards\" that is not an object");
        goto out;
    }
    const char *k;
    json_t *x;
    json_object_foreach(rs, k, x)
    {
        if (!json_is_number(x) || !(fabs(json_number_value(x)) <= AL_REWARD_MAX)) {
            al_err(errstr, errlen, "the agent's reward \"%.60s\" is not a finite number", k);
            goto out;
        }
    }
    *reward = json_number_value(r);
    /* What the proxy's reward endpoint takes: {"value": R} and the named rewards. */
    json_t *post = json_pack("{s:f}", "value", *reward);
    if (rs) json_object_set(post, "rewards", rs);
    char *txt = post ? json_dumps(post, JSON_COMPACT) : NULL;
    json_decref(post);
    if (!txt || strlen(txt) >= bodylen) {
        free(txt);
        al_err(errstr, errlen, "the agent's reward line is too long");
        goto out;
    }
    memcpy(body, txt, strlen(txt) + 1);
    free(txt);
    rc = 1;
out:
    json_decref(j);
    return rc;
}

void rl_rollout_base(char *out, size_t outlen, const char *proxy, int eval, double eval_temp,
                     const char *task, const char *rollout, int attempt)
{
    char route[48], at[24] = "";
    if (!eval)
        snprintf(route, sizeof route, "r");
    else if (eval_temp == 0)
        snprintf(route, sizeof route, "e");
    else
        snprintf(route, sizeof route, "e:%g", eval_temp);
    if (attempt > 0) snprintf(at, sizeof at, "/%d", attempt);
    snprintf(out, outlen, "%s/%s/%s/%s%s", proxy, route, task, rollout, at);
}
