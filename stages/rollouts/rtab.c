/*
 * rtab.c: the rollout controller's rollouts by id: the open rollouts in an al_map keyed by
 * id (spans name a rollout by its id) and the list of every rollout not yet reported.
 * rollouts.h declares its functions.
 */
#include "rollouts/rollouts.h"

#include <stdlib.h>
#include <string.h>

int rl_rtab_insert(rl_ctl *c, rl_rollout *r)
{
    if (al_map_put(&c->open, r->id, r)) return -1;
    if (al_vec_push(&c->live, r)) {
        al_map_remove(&c->open, r->id);
        return -1;
    }
    return 0;
}

rl_rollout *rl_rtab_find(const rl_ctl *c, const char *id)
{
    return al_map_get(&c->open, id);
}

void rl_rtab_remove(rl_ctl *c, rl_rollout *r)
{
    al_map_entry *e = al_map_find(&c->open, r->id);
    if (e && e->value == r) al_map_remove_entry(&c->open, e);
    for (size_t i = 0; i < c->live.n; i++)
        if (c->live.v[i] == r) {
            c->live.v[i] = c->live.v[--c->live.n];
            break;
        }
}
