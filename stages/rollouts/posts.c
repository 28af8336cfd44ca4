/*
 * posts.c: the rollout controller's posts to the proxy (rewards, ends): queued in order and
 * sent with libcurl from the loop, retried with backoff until the proxy takes them.
 */
#include "rollouts/rollouts.h"

#include "core/log.h"

#include <stdlib.h>
#include <string.h>

static size_t discard_cb(char *p, size_t s, size_t n, void *ud)
{
    (void)p, (void)ud;
    return s * n;
}

/* Queues a POST of body (copied) to url, after every post queued before it. Out of memory:
 * logged, the post is lost. */
void rl_posts_queue(rl_ctl *c, const char *url, const char *body)
{
    rl_post *p = calloc(1, sizeof *p);
    if (!p || !(p->body = strdup(body))) {
        free(p);
        al_log_error(COMP, "out of memory queueing a post to %s", url);
        return;
    }
    snprintf(p->url, sizeof p->url, "%s", url);
    if (c->ptail)
        c->ptail->next = p;
    else
        c->phead = p;
    c->ptail = p;
}

/* Sends what is due, in order; stops at the first post that fails (retried later, with
 * backoff: a proxy that is away holds every later post too, so that a rollout's end never
 * overtakes its reward). A 4xx answer is the proxy refusing the post for good: logged,
 * dropped. */
void rl_posts_run(rl_ctl *c, int64_t budget_us)
{
    int64_t until = al_mono_us() + budget_us;
    while (c->phead && al_mono_us() < until) {
        rl_post *p = c->phead;
        if (p->next_us > al_mono_us()) return;
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_reset(c->curl);
        curl_easy_setopt(c->curl, CURLOPT_URL, p->url);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, p->body);
        curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, 10000L);
        curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
        curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, discard_cb);
        CURLcode rc = curl_easy_perform(c->curl);
        long status = 0;
        curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        if (rc == CURLE_OK && status >= 200 && status < 500) {
            if (status >= 300)
                al_log_error(COMP, "the proxy refused POST %s (%s): HTTP %ld", p->url, p->body,
                             status);
            c->phead = p->next;
            if (!c->phead) c->ptail = NULL;
            free(p->body);
            free(p);
            continue;
        }
        p->tries++;
        int64_t back = 200000LL << (p->tries < 5 ? p->tries : 5);
        p->next_us = al_mono_us() + back;
        if (p->tries == 1 || p->tries % 20 == 0)
            al_log_warn(COMP, "POST %s: %s; retrying (attempt %d)", p->url,
                        rc != CURLE_OK ? curl_easy_strerror(rc) : "HTTP 5xx", p->tries + 1);
        return;
    }
}

/* At exit: logs and frees every post the proxy never took. */
void rl_posts_drop(rl_ctl *c)
{
    while (c->phead) {
        rl_post *p = c->phead;
        c->phead = p->next;
        al_log_error(COMP, "not delivered to the proxy: POST %s %s", p->url, p->body);
        free(p->body);
        free(p);
    }
}
