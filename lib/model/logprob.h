/*
 * logprob.h: from logits to the per-token log-probability of the target token and the
 * entropy of the next-token distribution, and back (d loss / d logits from d loss / d logp
 * and d loss / d entropy).
 *
 * logits are (T, V) row-major floats; targets (T) are token ids. With temperature tau the
 * distribution is softmax(logits / tau), as the sampler used it. Sums run in double with the
 * row maximum subtracted, so large logits neither overflow nor lose the small terms. Rows are
 * independent and split across OpenMP threads.
 *
 * A target < 0 means "no target here" (the last position of a sequence, padding): its logp is
 * 0 and its dlogp is ignored; its entropy is still computed.
 */
#ifndef ARCLIGHT_MODEL_LOGPROB_H
#define ARCLIGHT_MODEL_LOGPROB_H

#include <stddef.h>
#include <stdint.h>

/* Writes logp (T) = log softmax(logits/tau)[target] and, when entropy is not NULL,
 * entropy (T) = -sum_j p_j log p_j. Returns 0, or -1 with errstr naming the first target
 * >= V, a temperature <= 0 or a shape <= 0. */
int al_logprob_forward(const float *logits, const int32_t *targets, int T, int V,
                       float temperature, float *logp, float *entropy, char *errstr,
                       size_t errlen);

/* Writes dlogits (T, V) = d loss / d logits given dlogp (T) and dentropy (T) (either may be
 * NULL, meaning zeros). dlogits may be the logits buffer itself (in place): each row is read
 * whole before it is overwritten. Targets are trusted here (checked by the forward). */
void al_logprob_backward(const float *logits, const int32_t *targets, int T, int V,
                         float temperature, const float *dlogp, const float *dentropy,
                         float *dlogits);

#endif
