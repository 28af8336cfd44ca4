/*
 * fake_upstream.h: an OpenAI-compatible server that answers like vLLM (>= 0.10.2), for the
 * proxy's tests and benchmark. Deterministic: the prompt's token ids are the bytes of the
 * last message's content (at most 32), the answer is "The answer is 4." as tokens
 * 100..103 with logprobs -0.25, -0.5, -0.75, -1.0; with "tools" in the request the answer
 * is one tool call get_weather({"city":"Paris"}) streamed in two argument pieces.
 *
 *   return_token_ids: true  -> "prompt_token_ids" (top level) and per-choice "token_ids"
 *   logprobs: true / N      -> per-choice logprobs (chat: content[].logprob; completions:
 *                              token_logprobs); else "logprobs": null
 *   stream: true            -> SSE chunks; stream_options.include_usage adds the final
 *                              usage chunk (choices: [])
 *   model "fail-400" / "fail-500"  -> that status with an OpenAI-style error body
 *   model "slow-stream"     -> 100 ms between stream chunks
 *   model "big-stream"      -> 1500 content chunks of 2000 characters (3 MB), all at once
 *   model "huge-numbers"    -> a whole answer whose usage.prompt_tokens is 1e300 and whose
 *                              first chat logprob is -1e300
 *   model "echo-auth"       -> 401 whose message quotes the Authorization header it got
 *   model "fail-newline"    -> 400 whose message holds a newline and a fake log line
 *   model "bad-utf8"        -> a whole answer whose text holds bytes that are not UTF-8
 *   model "reasoning"       -> chat answers with reasoning_content "Two and two make four."
 *                              (whole; streamed in the first chunk, with the role)
 *   model "length"          -> finish_reason "length"
 *   a tool result as the last message -> text again (the agent's tool loop ends)
 *   POST /tokenize {"messages": [...]} -> {"count": the prompt's ids, as above}
 *   POST /v1/messages       served natively, as vLLM's Messages API: "The answer is 4."
 *                              in Anthropic's shape (whole, or its event stream), usage 9 in
 *                              and 4 out, and no token ids (vLLM's has no way to ask for them)
 * Whole responses carry unrequested fields as null (pydantic model_dump); stream chunks omit
 * them (exclude_unset), as vLLM does. Every answer has x-arclight-policy-version: 7.
 *
 * The server runs on its own threads (SO_REUSEPORT, one event loop per thread).
 */
#ifndef ARCLIGHT_TESTS_FAKE_UPSTREAM_H
#define ARCLIGHT_TESTS_FAKE_UPSTREAM_H

#include <stddef.h>

typedef struct fake_upstream fake_upstream;

/* Starts on 127.0.0.1:port (0: any free port) with nthreads loops. NULL on failure. */
fake_upstream *fake_upstream_start(int port, int nthreads);
int fake_upstream_port(const fake_upstream *u);
/* The Authorization header and body of the last POST (malloc'd copies; caller frees;
 * NULL when none), and how many requests were answered. */
char *fake_upstream_last_auth(fake_upstream *u);
char *fake_upstream_last_body(fake_upstream *u);
long fake_upstream_requests(fake_upstream *u);
void fake_upstream_stop(fake_upstream *u);

#endif
