/*
 * rtab.c: the rollout controller's rollouts by id: a chained hash table of the open
 * rollouts (spans name a rollout by its id) and the list of every rollout not yet reported.
 * A local table until lib/core's map replaces it; rollouts.h declares its functions.
 */
#include "rollouts/rollouts.h"

#include <stdlib.h>
#include <string.h>

static uint64_t id_hash(const char *s)
{
    return rl_hash(s);
}

int rl_rtab_insert(rl_ctl *c, rl_rollout *r)
{
    if (c->nlive + 1 > c->rcap / 2) {
        size_t nc = c->rcap ? c->rcap * 2 : 256;
        rl_rollout **nt = calloc(nc, sizeof *nt);
        if (!nt) return -1;
        for (size_t i = 0; i < c->rcap; i++)
            for (rl_rollout *x = c->rtab[i], *nx; x; x = nx) {
                nx = x->hnext;
                size_t b = id_hash(x->id) & (nc - 1);
                x->hnext = nt[b];
                nt[b] = x;
            }
        free(c->rtab);
        c->rtab = nt;
        c->rcap = nc;
    }
    size_t b = id_hash(r->id) & (c->rcap - 1);
    r->hnext = c->rtab[b];
    c->rtab[b] = r;
    if (c->nlive == c->caplive) {
        size_t nc = c->caplive ? c->caplive * 2 : 64;
        rl_rollout **nl = realloc(c->live, nc * sizeof *nl);
        if (!nl) return -1;
        c->live = nl;
        c->caplive = nc;
    }
    c->live[c->nlive++] = r;
    return 0;
}

rl_rollout *rl_rtab_find(const rl_ctl *c, const char *id)
{
    if (!c->rcap) return NULL;
    for (rl_rollout *x = c->rtab[id_hash(id) & (c->rcap - 1)]; x; x = x->hnext)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

void rl_rtab_remove(rl_ctl *c, rl_rollout *r)
{
    rl_rollout **pp = &c->rtab[id_hash(r->id) & (c->rcap - 1)];
    while (*pp && *pp != r)
        pp = &(*pp)->hnext;
    if (*pp) *pp = r->hnext;
    for (size_t i = 0; i < c->nlive; i++)
        if (c->live[i] == r) {
            c->live[i] = c->live[--c->nlive];
            break;
        }
}
