/*
 * t1421_letters_api_checks.h: what the tests of the letters agents on the Responses API
 * (1406) and the Anthropic Messages API (1407) check beyond lt_check_rollouts. Their spans
 * keep the agent's own request and answer (a Response object; a Message), not the chat
 * completions the proxy made of them, so the tool calls are read in each API's own shape.
 * Header-only (static); include after t1420_letters_helpers.h and venv.h.
 */
#ifndef ARCLIGHT_T1421_LETTERS_API_CHECKS_H
#define ARCLIGHT_T1421_LETTERS_API_CHECKS_H

enum { LT_RESPONSES, LT_MESSAGES };

/* the string member m of o, or "" */
static const char *lt_str(json_t *o, const char *m)
{
    const char *s = json_string_value(json_object_get(o, m));
    return s ? s : "";
}

/* Appends a JSON string whole (a NUL token inside it included); nothing for a non-string. */
static void lt_buf_json_text(al_buf *b, const json_t *s)
{
    if (json_is_string(s)) al_buf_append(b, json_string_value(s), json_string_length(s));
}

/* The key of the first open_door call in a captured answer (a string owned by *hold, which
 * the caller decrefs), or NULL when the answer called no tool with a string key; *any_tool
 * says whether it called a tool at all. text gets the answer's text (a new reference). */
static const char *lt_api_first_key(int api, const al_span *call, json_t **hold, int *any_tool,
                                    json_t **text)
{
    json_t *ans = json_loads(call->llm_call.response_json ? call->llm_call.response_json : "",
                             JSON_ALLOW_NUL, NULL);
    *hold = ans, *any_tool = 0;
    const char *key = NULL;
    al_buf t = {0};
    json_t *item;
    size_t i;
    if (api == LT_RESPONSES) {
        json_array_foreach(json_object_get(ans, "output"), i, item)
        {
            const char *type = lt_str(item, "type");
            if (!strcmp(type, "message")) {
                json_t *part;
                size_t k;
                json_array_foreach(json_object_get(item, "content"), k, part)
                    lt_buf_json_text(&t, json_object_get(part, "text"));
            }
            if (strcmp(type, "function_call")) continue;
            *any_tool = 1;
            if (key || strcmp(lt_str(item, "name"), "open_door"))
                continue;
            json_t *args = json_loads(json_string_value(json_object_get(item, "arguments")) ?: "",
                                      0, NULL);
            if (json_is_string(json_object_get(args, "key"))) {
                json_object_set(ans, "_key", json_object_get(args, "key"));
                key = json_string_value(json_object_get(ans, "_key"));
            }
            json_decref(args);
        }
    } else {
        json_array_foreach(json_object_get(ans, "content"), i, item)
        {
            const char *type = lt_str(item, "type");
            if (!strcmp(type, "text"))
                lt_buf_json_text(&t, json_object_get(item, "text"));
            if (strcmp(type, "tool_use")) continue;
            *any_tool = 1;
            if (!key && !strcmp(lt_str(item, "name"), "open_door"))
                key = json_string_value(json_object_get(json_object_get(item, "input"), "key"));
        }
    }
    *text = json_stringn(t.data ? t.data : "", t.len);
    al_buf_free(&t);
    return key;
}

/* The last tool result the agent sent in a call's request: a function_call_output's output
 * (Responses) or a tool_result block's content (Messages); NULL if none. Borrowed from req. */
static const char *lt_api_last_result(int api, json_t *req)
{
    json_t *items = json_object_get(req, api == LT_RESPONSES ? "input" : "messages");
    json_t *last = json_array_get(items, json_array_size(items) - 1);
    if (api == LT_RESPONSES)
        return !strcmp(lt_str(last, "type"), "function_call_output")
                   ? json_string_value(json_object_get(last, "output"))
                   : NULL;
    json_t *blocks = json_object_get(last, "content");
    json_t *b = json_array_get(blocks, json_array_size(blocks) - 1);
    return !strcmp(lt_str(b, "type"), "tool_result")
               ? json_string_value(json_object_get(b, "content"))
               : NULL;
}

/* Whether a call's captured answer is the API's answer object (a Response with "output", a
 * Message with "content"), not an error the client then retried. */
static int lt_api_answered(int api, const al_span *call)
{
    /* JSON_ALLOW_NUL: a random policy's NUL token (\u0000) is JSON too */
    json_t *a = json_loads(call->llm_call.response_json ? call->llm_call.response_json : "",
                           JSON_ALLOW_NUL, NULL);
    int ok = json_is_array(json_object_get(a, api == LT_RESPONSES ? "output" : "content"));
    json_decref(a);
    return ok;
}

/* Each rollout scored as the agents document (examples/letters/letters.py): a first call
 * that called open_door with a string key has that key's share of k, halved, as the key
 * reward and a second call whose request ends with the door's answer as the tool's
 * result, and the room reward is half the second answer's share of the room's letter (0
 * when it called a tool again); a first call in text is the only call, scored on its text,
 * room 0. Every call's request carries the one tool, named open_door. A call answered with
 * an error is one the client retried (the anthropic and openai clients retry a 5xx): the
 * calls that count are the answered ones. Returns how many first calls were open_door
 * calls. */
static int lt_check_api_agent(int api, const lt_rollout *o, size_t n)
{
    int tool_calls = 0;
    for (size_t k = 0; k < n; k++) {
        const lt_rollout *r = &o[k];
        if (!r->ncalls) continue;
        for (int i = 0; i < r->ncalls; i++) {
            json_t *req = json_loads(r->calls[i]->llm_call.request_json, JSON_ALLOW_NUL, NULL);
            json_t *tools = json_object_get(req, "tools");
            CHECKF(json_array_size(tools) == 1 &&
                       !strcmp(lt_str(json_array_get(tools, 0), "name"), "open_door"),
                   "rollout %s call %d: tools %s", r->rollout, i,
                   r->calls[i]->llm_call.request_json);
            json_decref(req);
        }
        const al_span *calls[8];
        int ncalls = 0;
        for (int i = 0; i < r->ncalls; i++)
            if (lt_api_answered(api, r->calls[i])) calls[ncalls++] = r->calls[i];
        if (ncalls < r->ncalls)
            fprintf(stderr, "rollout %s: %d of its %d calls answered with an error (retried)\n",
                    r->rollout, r->ncalls - ncalls, r->ncalls);
        CHECKF(ncalls >= 1, "rollout %s: no call answered", r->rollout);
        if (!ncalls) continue;
        const al_span *key = lt_reward(r, "key"), *room = lt_reward(r, "room");
        CHECKF(key && room && r->nrewards == 2, "rollout %s: rewards key %p, room %p of %d",
               r->rollout, (const void *)key, (const void *)room, r->nrewards);
        if (!key || !room) continue;
        json_t *hold, *text;
        int any_tool;
        const char *attempt = lt_api_first_key(api, calls[0], &hold, &any_tool, &text);
        if (attempt) {
            tool_calls++;
            CHECK_NEAR(key->reward.value, lt_share(attempt, 'k') / 2, 1e-9);
            CHECKF(ncalls == 2, "rollout %s: a tool call, then %d calls in all", r->rollout,
                   ncalls);
            if (ncalls == 2) {
                char door[128];
                lt_door_answer(lt_room_of(r->task), attempt, door, sizeof door);
                json_t *req = json_loads(calls[1]->llm_call.request_json, JSON_ALLOW_NUL, NULL);
                const char *got = lt_api_last_result(api, req);
                CHECKF(got && !strcmp(got, door), "rollout %s: call 2 does not end with the door's "
                                                  "answer '%s': %s",
                       r->rollout, door, calls[1]->llm_call.request_json);
                json_decref(req);
                json_t *hold2, *text2;
                int tool2;
                lt_api_first_key(api, calls[1], &hold2, &tool2, &text2);
                char room_letter = lt_room_of(r->task);
                double want = tool2 ? 0 : lt_share_json(text2, room_letter) / 2;
                CHECK_NEAR(room->reward.value, want, 1e-9);
                json_decref(hold2);
                json_decref(text2);
            }
        } else if (any_tool) { /* a tool call the agent could not run: no door, both 0 */
            CHECK_NEAR(key->reward.value, 0, 0);
            CHECK_NEAR(room->reward.value, 0, 0);
        } else {
            CHECKF(ncalls == 1, "rollout %s: call 1 in text, then %d calls", r->rollout,
                   ncalls);
            /* The Responses agent scores the text of the stream's deltas; the final object's
             * text must be the same. (They disagreed once in about 40 text rollouts on the
             * random model: a NUL token cut the final text short, in lib/api/responses.c and
             * in this check's counting; both now go by the string's length.) */
            double want = lt_share_json(text, 'k') / 2;
            CHECKF(fabs(key->reward.value - want) < 1e-9,
                   "rollout %s: key reward %g, the answer's text gives %g: %s", r->rollout,
                   key->reward.value, want, calls[0]->llm_call.response_json);
            CHECK_NEAR(room->reward.value, 0, 0);
        }
        json_decref(hold);
        json_decref(text);
    }
    return tool_calls;
}

/* The test of a Python agent on another API: the tiny random model, ntrain train tasks in
 * groups of two and one val task through the controller, the proxy (translating the API to
 * serve's chat completions) and serve. */
static void lt_api_agent_test(const char *tag, int api, const char *agent, int ntrain)
{
    char py[1024];
    al_test_venv_python(py, sizeof py, api == LT_RESPONSES ? "openai" : "anthropic");
    lt_run r;
    REQUIRE(lt_start(&r, tag, NULL, NULL) == 0);
    int st = lt_rollouts_cmd(&r, py, agent, ntrain, 1, 2);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rollouts: status %d after %.0f s:\n%s", st,
           r.rollouts_s, r.rollouts_log);
    size_t want = (size_t)ntrain * 2 + 1;
    CHECK(lt_read_spans(&r, want) == want);
    lt_rollout o[64];
    size_t n = lt_rollouts_of(&r, o, 64);
    /* two calls at most, each maybe retried once by the client */
    int calls = lt_check_rollouts(o, n, want, 1, 4);
    int tools = lt_check_api_agent(api, o, n);
    fprintf(stderr, "%s: %zu rollouts, %d calls in %.0f s; %d first calls were open_door calls\n",
            agent, n, calls, r.rollouts_s, tools);
    lt_stop(&r);
}

#endif
