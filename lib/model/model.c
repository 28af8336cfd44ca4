/*
 * model.c: the decoder's parameters, activations, forward and backward passes.
 */
#include "model/model.h"

#include "model/gemm.h"
#include "model/layers.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Activations kept from forward for backward, per layer stacked over L, each (T, width)
 * unless noted; one allocation sized for `cap_T` tokens. */
typedef struct acts {
    float *res;     /* (L+1, T, C) residual stream entering each layer; [L] enters the final norm */
    float *res_mid; /* (L, T, C) residual after attention */
    float *ln1;     /* (L, T, C) */
    float *ln1_rstd; /* (L, T) */
    float *q_pre;    /* (L, T, NH*HD) q before its norm (qk_norm only) */
    float *k_pre;    /* (L, T, NKV*HD) */
    float *qn_rstd;  /* (L, T*NH) */
    float *kn_rstd;  /* (L, T*NKV) */
    float *q;        /* (L, T, NH*HD) q as attention sees it (normed, rotated) */
    float *k;        /* (L, T, NKV*HD) */
    float *v;        /* (L, T, NKV*HD) */
    float *atty;     /* (L, T, NH*HD) attention output before o_proj */
    float *ln2;      /* (L, T, C) */
    float *ln2_rstd; /* (L, T) */
    float *gate;     /* (L, T, I) */
    float *up;       /* (L, T, I) */
    float *lnf;      /* (T, C) */
    float *lnf_rstd; /* (T) */
    float *rope_cos; /* (T, HD/2) */
    float *rope_sin; /* (T, HD/2) */
    /* backward scratch */
    float *dres;  /* (T, C) */
    float *dln;   /* (T, C) */
    float *dq;    /* (T, NH*HD) */
    float *dq2;   /* (T, NH*HD) */
    float *dk;    /* (T, NKV*HD) */
    float *dk2;   /* (T, NKV*HD) */
    float *dv;    /* (T, NKV*HD) */
    float *dbig;  /* (T, max(I, NH*HD)) d of atty or of h */
    float *dgate; /* (T, I); also silu(gate) * up, recomputed rather than kept per layer */
    float *dup;   /* (T, I) */
} acts;

struct al_model {
    al_model_config cfg;
    size_t nparams;
    float *params_mem, *grads_mem;
    al_model_weights p, g;
    al_model_tensor *tensors;
    size_t ntensors;

    float *act_mem;
    size_t act_floats;
    int cap_T;
    acts a;
    float *att_scratch; /* attention blocks of one sequence (al_attention_scratch_size) */
    size_t scratch_cap;

    /* the last forward's batch, for backward */
    int T, nseq, have_forward;
    int32_t *tokens, *cu_seqlens;
    int tok_cap, seq_cap;

    char err[256];
};

static int model_err(al_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int model_err(al_model *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return -1;
}

const char *al_model_error(const al_model *m)
{
    return m->err;
}
const al_model_config *al_model_config_of(const al_model *m)
{
    return &m->cfg;
}
size_t al_model_num_params(const al_model *m)
{
    return m->nparams;
}
float *al_model_params(al_model *m)
{
    return m->params_mem;
}
float *al_model_grads(al_model *m)
{
    return m->grads_mem;
}
const al_model_weights *al_model_param_tensors(const al_model *m)
{
    return &m->p;
}
const al_model_weights *al_model_grad_tensors(const al_model *m)
{
    return &m->g;
}
size_t al_model_num_tensors(const al_model *m)
{
    return m->ntensors;
}
const al_model_tensor *al_model_tensors(const al_model *m)
{
    return m->tensors;
}

const al_model_tensor *al_model_tensor_find(const al_model *m, const char *name)
{
    for (size_t i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

size_t al_model_activation_bytes(const al_model *m)
{
    return sizeof(float) * (m->act_floats + m->scratch_cap);
}

/* Lays the stacked parameter blocks out in one array (first pass counts, with base NULL)
 * and points each struct field into `base`. Returns the number of floats. */
static size_t layout_params(const al_model_config *c, float *base, al_model_weights *p)
{
    size_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, L = c->num_layers;
    size_t Q = (size_t)c->num_heads * c->head_dim, KV = (size_t)c->num_kv_heads * c->head_dim;
    size_t HD = c->head_dim, off = 0;
    memset(p, 0, sizeof *p);
#define TAKE(field, n)                                                                             \
    do {                                                                                           \
        p->field = base ? base + off : NULL;                                                       \
        off += (n);                                                                                \
    } while (0)
    TAKE(embed, V * C);
    TAKE(ln1, L * C);
    TAKE(wq, L * Q * C);
    if (c->qkv_bias) TAKE(bq, L * Q);
    TAKE(wk, L * KV * C);
    if (c->qkv_bias) TAKE(bk, L * KV);
    TAKE(wv, L * KV * C);
    if (c->qkv_bias) TAKE(bv, L * KV);
    TAKE(wo, L * C * Q);
    if (c->o_bias) TAKE(bo, L * C);
    if (c->qk_norm) {
        TAKE(q_norm, L * HD);
        TAKE(k_norm, L * HD);
    }
    TAKE(ln2, L * C);
    TAKE(w_gate, L * I * C);
    TAKE(w_up, L * I * C);
    TAKE(w_down, L * C * I);
    TAKE(ln_f, C);
    if (c->tie_word_embeddings)
        p->lm_head = p->embed;
    else
        TAKE(lm_head, V * C);
#undef TAKE
    return off;
}

static void add_tensor(al_model *m, const char *name, const float *field, size_t layer_stride,
                       int layer, int ndim, int64_t d0, int64_t d1)
{
    al_model_tensor *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = (size_t)(field - m->params_mem) + (size_t)layer * layer_stride;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
}

/* The Hugging Face name table, in the order transformers lists the state dict. */
static int build_tensor_table(al_model *m)
{
    const al_model_config *c = &m->cfg;
    int64_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
    int64_t Q = (int64_t)c->num_heads * c->head_dim, KV = (int64_t)c->num_kv_heads * c->head_dim;
    int64_t HD = c->head_dim;
    size_t max = 3 + (size_t)c->num_layers * 16;
    m->tensors = calloc(max, sizeof *m->tensors);
    if (!m->tensors) return -1;
    const al_model_weights *p = &m->p;
    char name[96];
    add_tensor(m, "model.embed_tokens.weight", p->embed, 0, 0, 2, V, C);
    for (int l = 0; l < c->num_layers; l++) {
#define T2(suffix, field, d0, d1)                                                                  \
    do {                                                                                           \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                              \
        add_tensor(m, name, p->field, (size_t)((d0) * (d1)), l, 2, d0, d1);                        \
    } while (0)
#define T1(suffix, field, d0)                                                                      \
    do {                                                                                           \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                              \
        add_tensor(m, name, p->field, (size_t)(d0), l, 1, d0, 0);                                  \
    } while (0)
        T1("input_layernorm.weight", ln1, C);
        T2("self_attn.q_proj.weight", wq, Q, C);
        if (c->qkv_bias) T1("self_attn.q_proj.bias", bq, Q);
        T2("self_attn.k_proj.weight", wk, KV, C);
        if (c->qkv_bias) T1("self_attn.k_proj.bias", bk, KV);
        T2("self_attn.v_proj.weight", wv, KV, C);
        if (c->qkv_bias) T1("self_attn.v_proj.bias", bv, KV);
        T2("self_attn.o_proj.weight", wo, C, Q);
        if (c->o_bias) T1("self_attn.o_proj.bias", bo, C);
        if (c->qk_norm) {
            T1("self_attn.q_norm.weight", q_norm, HD);
            T1("self_attn.k_norm.weight", k_norm, HD);
        }
        T1("post_attention_layernorm.weight", ln2, C);
        T2("mlp.gate_proj.weight", w_gate, I, C);
        T2("mlp.up_proj.weight", w_up, I, C);
        T2("mlp.down_proj.weight", w_down, C, I);
#undef T1
#undef T2
    }
    add_tensor(m, "model.norm.weight", p->ln_f, 0, 0, 1, C, 0);
    if (!c->tie_word_embeddings) add_tensor(m, "lm_head.weight", p->lm_head, 0, 0, 2, V, C);
    return 0;
}

al_model *al_model_new(const al_model_config *cfg, char *errstr, size_t errlen)
{
    if (al_model_config_validate(cfg, errstr, errlen)) return NULL;
    al_model *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->cfg = *cfg;
    m->nparams = layout_params(cfg, NULL, &m->p);
    m->params_mem = calloc(m->nparams, sizeof(float));
    m->grads_mem = calloc(m->nparams, sizeof(float));
    if (!m->params_mem || !m->grads_mem) goto oom;
    layout_params(cfg, m->params_mem, &m->p);
    layout_params(cfg, m->grads_mem, &m->g);
    if (build_tensor_table(m)) goto oom;
    return m;
oom:
    if (errstr && errlen)
        snprintf(errstr, errlen, "model: out of memory for %zu parameters",
                 al_model_config_num_params(cfg));
    al_model_free(m);
    return NULL;
}

void al_model_free(al_model *m)
{
    if (!m) return;
    free(m->params_mem);
    free(m->grads_mem);
    free(m->tensors);
    free(m->act_mem);
    free(m->att_scratch);
    free(m->tokens);
    free(m->cu_seqlens);
    free(m);
}

void al_model_zero_grad(al_model *m)
{
    memset(m->grads_mem, 0, sizeof(float) * m->nparams);
}

/* splitmix64: a small, well-mixed generator whose stream depends only on the seed. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return ((splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void al_model_init_random(al_model *m, uint64_t seed)
{
    /* Each tensor draws from its own stream (seed, tensor index), so tensors can be
     * initialized in any order and a model of another depth shares its first layers. */
    for (size_t i = 0; i < m->ntensors; i++) {
        const al_model_tensor *t = &m->tensors[i];
        float *w = m->params_mem + t->offset;
        const char *n = t->name;
        size_t len = strlen(n);
        int is_norm = strstr(n, "norm.weight") != NULL;
        int is_bias = len > 5 && !strcmp(n + len - 5, ".bias");
        if (is_norm) {
            for (size_t j = 0; j < t->numel; j++)
                w[j] = 1.0f;
        } else if (is_bias) {
            memset(w, 0, sizeof(float) * t->numel);
        } else {
            uint64_t s = seed ^ (0xA24BAED4963EE407ULL * (i + 1));
            for (size_t j = 0; j < t->numel; j += 2) {
                double u1 = uniform01(&s), u2 = uniform01(&s);
                double r = sqrt(-2.0 * log(u1)) * 0.02;
                w[j] = (float)(r * cos(6.283185307179586 * u2));
                if (j + 1 < t->numel) w[j + 1] = (float)(r * sin(6.283185307179586 * u2));
            }
        }
    }
}

/* Grows the activation buffers to hold T tokens (no-op when they already do). */
static int ensure_acts(al_model *m, int T)
{
    if (T <= m->cap_T) return 0;
    const al_model_config *c = &m->cfg;
    size_t C = c->hidden_size, I = c->intermediate_size, L = c->num_layers;
    size_t Q = (size_t)c->num_heads * c->head_dim, KV = (size_t)c->num_kv_heads * c->head_dim;
    size_t NH = c->num_heads, NKV = c->num_kv_heads, half = c->head_dim / 2;
    size_t t = (size_t)T, big = I > Q ? I : Q;
    size_t sizes[] = {
        (L + 1) * t * C,
        L * t * C,
        L * t * C,
        L * t,
        c->qk_norm ? L * t * Q : 0,
        c->qk_norm ? L * t * KV : 0,
        c->qk_norm ? L * t * NH : 0,
        c->qk_norm ? L * t * NKV : 0,
        L * t * Q,
        L * t * KV,
        L * t * KV,
        L * t * Q,
        L * t * C,
        L * t,
        L * t * I,
        L * t * I,
        t * C,
        t,
        t * half,
        t * half,
        t * C,
        t * C,
        t * Q,
        t * Q,
        t * KV,
        t * KV,
        t * KV,
        t * big,
        t * I,
        t * I,
    };
    float **fields[] = {
        &m->a.res,      &m->a.res_mid,  &m->a.ln1,  &m->a.ln1_rstd, &m->a.q_pre, &m->a.k_pre,
        &m->a.qn_rstd,  &m->a.kn_rstd,  &m->a.q,    &m->a.k,        &m->a.v,     &m->a.atty,
        &m->a.ln2,      &m->a.ln2_rstd, &m->a.gate, &m->a.up,       &m->a.lnf,   &m->a.lnf_rstd,
        &m->a.rope_cos, &m->a.rope_sin, &m->a.dres, &m->a.dln,      &m->a.dq,    &m->a.dq2,
        &m->a.dk,       &m->a.dk2,      &m->a.dv,   &m->a.dbig,     &m->a.dgate, &m->a.dup,
    };
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof fields / sizeof fields[0],
                   "one size per activation");
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += sizes[i];
    float *mem = malloc(sizeof(float) * (total ? total : 1));
    if (!mem) return model_err(m, "model: out of memory for activations of %d tokens", T);
    free(m->act_mem);
    m->act_mem = mem;
    m->act_floats = total;
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *fields[i] = sizes[i] ? mem + off : NULL;
        off += sizes[i];
    }
    m->cap_T = T;
    return 0;
}

static int ensure_floats(float **buf, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    float *b = malloc(sizeof(float) * n);
    if (!b) return -1;
    free(*buf);
    *buf = b;
    *cap = n;
    return 0;
}

int al_model_forward(al_model *m, const int32_t *tokens, const int32_t *positions,
                     const int32_t *cu_seqlens, int nseq, int T, float *logits)
{
    const al_model_config *c = &m->cfg;
    m->have_forward = 0;
    m->err[0] = 0;
    if (T <= 0 || nseq <= 0) return model_err(m, "model: empty batch (T=%d, nseq=%d)", T, nseq);
    if (cu_seqlens[0] != 0 || cu_seqlens[nseq] != T)
        return model_err(m, "model: cu_seqlens must run from 0 to T=%d (got %d..%d)", T,
                         cu_seqlens[0], cu_seqlens[nseq]);
    for (int s = 0; s < nseq; s++)
        if (cu_seqlens[s + 1] < cu_seqlens[s])
            return model_err(m, "model: cu_seqlens decreases at sequence %d", s);
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return model_err(m, "model: token %d at position %d is outside the vocabulary (%d)",
                             tokens[t], t, c->vocab_size);
        if (positions[t] < 0)
            return model_err(m, "model: negative position %d at token %d", positions[t], t);
    }
    size_t scratch = al_attention_scratch_size(cu_seqlens, nseq, c->num_heads, c->head_dim);
    if (ensure_acts(m, T) || ensure_floats(&m->att_scratch, &m->scratch_cap, scratch)) {
        if (!m->err[0]) model_err(m, "model: out of memory for attention of %d tokens", T);
        return -1;
    }
    if (T > m->tok_cap) {
        int32_t *b = realloc(m->tokens, sizeof(int32_t) * (size_t)T);
        if (!b) return model_err(m, "model: out of memory");
        m->tokens = b, m->tok_cap = T;
    }
    if (nseq + 1 > m->seq_cap) {
        int32_t *b = realloc(m->cu_seqlens, sizeof(int32_t) * (size_t)(nseq + 1));
        if (!b) return model_err(m, "model: out of memory");
        m->cu_seqlens = b, m->seq_cap = nseq + 1;
    }
    memcpy(m->tokens, tokens, sizeof(int32_t) * (size_t)T);
    memcpy(m->cu_seqlens, cu_seqlens, sizeof(int32_t) * (size_t)(nseq + 1));
    m->T = T, m->nseq = nseq;

    int C = c->hidden_size, I = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, Q = NH * HD, KV = NKV * HD;
    size_t tC = (size_t)T * C, tQ = (size_t)T * Q, tKV = (size_t)T * KV, tI = (size_t)T * I;
    float eps = (float)c->rms_norm_eps;
    acts *a = &m->a;
    const al_model_weights *p = &m->p;

    al_rope_tables(a->rope_cos, a->rope_sin, positions, T, HD, c->rope_theta);
    al_embedding_forward(a->res, tokens, p->embed, T, C);
    for (int l = 0; l < c->num_layers; l++) {
        float *x = a->res + l * tC, *ln1 = a->ln1 + l * tC, *q = a->q + l * tQ;
        float *k = a->k + l * tKV, *v = a->v + l * tKV, *atty = a->atty + l * tQ;
        float *mid = a->res_mid + l * tC, *ln2 = a->ln2 + l * tC;
        float *gate = a->gate + l * tI, *up = a->up + l * tI, *h = a->dgate;
        al_rmsnorm_forward(ln1, a->ln1_rstd + (size_t)l * T, x, p->ln1 + (size_t)l * C, T, C, eps);
        if (c->qk_norm) {
            float *qp = a->q_pre + l * tQ, *kp = a->k_pre + l * tKV;
            al_linear_forward(qp, ln1, p->wq + (size_t)l * Q * C,
                              p->bq ? p->bq + (size_t)l * Q : NULL, T, C, Q);
            al_linear_forward(kp, ln1, p->wk + (size_t)l * KV * C,
                              p->bk ? p->bk + (size_t)l * KV : NULL, T, C, KV);
            al_rmsnorm_forward(q, a->qn_rstd + (size_t)l * T * NH, qp, p->q_norm + (size_t)l * HD,
                               T * NH, HD, eps);
            al_rmsnorm_forward(k, a->kn_rstd + (size_t)l * T * NKV, kp, p->k_norm + (size_t)l * HD,
                               T * NKV, HD, eps);
        } else {
            al_linear_forward(q, ln1, p->wq + (size_t)l * Q * C,
                              p->bq ? p->bq + (size_t)l * Q : NULL, T, C, Q);
            al_linear_forward(k, ln1, p->wk + (size_t)l * KV * C,
                              p->bk ? p->bk + (size_t)l * KV : NULL, T, C, KV);
        }
        al_linear_forward(v, ln1, p->wv + (size_t)l * KV * C, p->bv ? p->bv + (size_t)l * KV : NULL,
                          T, C, KV);
        al_rope_forward(q, a->rope_cos, a->rope_sin, T, NH, HD);
        al_rope_forward(k, a->rope_cos, a->rope_sin, T, NKV, HD);
        al_attention_forward(atty, m->att_scratch, q, k, v, cu_seqlens, nseq, NH, NKV, HD);
        al_linear_forward(mid, atty, p->wo + (size_t)l * C * Q,
                          p->bo ? p->bo + (size_t)l * C : NULL, T, Q, C);
        al_residual_forward(mid, mid, x, tC);
        al_rmsnorm_forward(ln2, a->ln2_rstd + (size_t)l * T, mid, p->ln2 + (size_t)l * C, T, C,
                           eps);
        al_linear_forward(gate, ln2, p->w_gate + (size_t)l * I * C, NULL, T, C, I);
        al_linear_forward(up, ln2, p->w_up + (size_t)l * I * C, NULL, T, C, I);
        al_swiglu_forward(h, gate, up, tI);
        float *next = a->res + (l + 1) * tC;
        al_linear_forward(next, h, p->w_down + (size_t)l * C * I, NULL, T, I, C);
        al_residual_forward(next, next, mid, tC);
    }
    al_rmsnorm_forward(a->lnf, a->lnf_rstd, a->res + (size_t)c->num_layers * tC, p->ln_f, T, C,
                       eps);
    al_lm_head_forward(logits, a->lnf, p->lm_head, T, C, c->vocab_size);
    m->have_forward = 1;
    return 0;
}

int al_model_backward(al_model *m, const float *dlogits)
{
    if (!m->have_forward) return model_err(m, "model: backward without a forward");
    const al_model_config *c = &m->cfg;
    int T = m->T, C = c->hidden_size, I = c->intermediate_size, NH = c->num_heads;
    int NKV = c->num_kv_heads, HD = c->head_dim, Q = NH * HD, KV = NKV * HD;
    size_t tC = (size_t)T * C, tQ = (size_t)T * Q, tKV = (size_t)T * KV, tI = (size_t)T * I;
    acts *a = &m->a;
    const al_model_weights *p = &m->p;
    const al_model_weights *g = &m->g;

    memset(a->dln, 0, sizeof(float) * tC);
    al_lm_head_backward(a->dln, g->lm_head, dlogits, a->lnf, p->lm_head, T, C, c->vocab_size);
    memset(a->dres, 0, sizeof(float) * tC);
    al_rmsnorm_backward(a->dres, g->ln_f, a->dln, a->res + (size_t)c->num_layers * tC, p->ln_f,
                        a->lnf_rstd, T, C);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        const float *x = a->res + l * tC, *ln1 = a->ln1 + l * tC, *q = a->q + l * tQ;
        const float *k = a->k + l * tKV, *v = a->v + l * tKV, *atty = a->atty + l * tQ;
        const float *mid = a->res_mid + l * tC, *ln2 = a->ln2 + l * tC;
        const float *gate = a->gate + l * tI, *up = a->up + l * tI;
        /* MLP branch: res[l+1] = mid + down(swiglu(gate(ln2), up(ln2))); the product h is
         * recomputed into dgate's buffer, which swiglu's backward then overwrites. */
        al_swiglu_forward(a->dgate, gate, up, tI);
        memset(a->dbig, 0, sizeof(float) * tI);
        al_linear_backward(a->dbig, g->w_down + (size_t)l * C * I, NULL, a->dres, a->dgate,
                           p->w_down + (size_t)l * C * I, T, I, C);
        al_swiglu_backward(a->dgate, a->dup, a->dbig, gate, up, tI);
        memset(a->dln, 0, sizeof(float) * tC);
        al_linear_backward(a->dln, g->w_gate + (size_t)l * I * C, NULL, a->dgate, ln2,
                           p->w_gate + (size_t)l * I * C, T, C, I);
        al_linear_backward(a->dln, g->w_up + (size_t)l * I * C, NULL, a->dup, ln2,
                           p->w_up + (size_t)l * I * C, T, C, I);
        al_rmsnorm_backward(a->dres, g->ln2 + (size_t)l * C, a->dln, mid, p->ln2 + (size_t)l * C,
                            a->ln2_rstd + (size_t)l * T, T, C);
        /* attention branch: mid = x + o(attention(rope(norm(q(ln1))), ...)) */
        memset(a->dbig, 0, sizeof(float) * tQ);
        al_linear_backward(a->dbig, g->wo + (size_t)l * C * Q, g->bo ? g->bo + (size_t)l * C : NULL,
                           a->dres, atty, p->wo + (size_t)l * C * Q, T, Q, C);
        al_attention_backward(a->dq, a->dk, a->dv, m->att_scratch, a->dbig, q, k, v, m->cu_seqlens,
                              m->nseq, NH, NKV, HD);
        al_rope_backward(a->dq, a->rope_cos, a->rope_sin, T, NH, HD);
        al_rope_backward(a->dk, a->rope_cos, a->rope_sin, T, NKV, HD);
        float *dq = a->dq, *dk = a->dk;
        if (c->qk_norm) {
            memset(a->dq2, 0, sizeof(float) * tQ);
            memset(a->dk2, 0, sizeof(float) * tKV);
            al_rmsnorm_backward(a->dq2, g->q_norm + (size_t)l * HD, a->dq, a->q_pre + l * tQ,
                                p->q_norm + (size_t)l * HD, a->qn_rstd + (size_t)l * T * NH, T * NH,
                                HD);
            al_rmsnorm_backward(a->dk2, g->k_norm + (size_t)l * HD, a->dk, a->k_pre + l * tKV,
                                p->k_norm + (size_t)l * HD, a->kn_rstd + (size_t)l * T * NKV,
                                T * NKV, HD);
            dq = a->dq2, dk = a->dk2;
        }
        memset(a->dln, 0, sizeof(float) * tC);
        al_linear_backward(a->dln, g->wq + (size_t)l * Q * C, g->bq ? g->bq + (size_t)l * Q : NULL,
                           dq, ln1, p->wq + (size_t)l * Q * C, T, C, Q);
        al_linear_backward(a->dln, g->wk + (size_t)l * KV * C,
                           g->bk ? g->bk + (size_t)l * KV : NULL, dk, ln1,
                           p->wk + (size_t)l * KV * C, T, C, KV);
        al_linear_backward(a->dln, g->wv + (size_t)l * KV * C,
                           g->bv ? g->bv + (size_t)l * KV : NULL, a->dv, ln1,
                           p->wv + (size_t)l * KV * C, T, C, KV);
        al_rmsnorm_backward(a->dres, g->ln1 + (size_t)l * C, a->dln, x, p->ln1 + (size_t)l * C,
                            a->ln1_rstd + (size_t)l * T, T, C);
    }
    al_embedding_backward(g->embed, a->dres, m->tokens, T, C);
    return 0;
}

/* ---- inference with a KV cache ---- */

struct al_model_kv {
    int L, max, len, kvw;
    float *k, *v;   /* (L, max, NKV*HD) rotated keys and values of positions 0..len-1 */
    float *scratch; /* for cap_n new tokens, see kv_ensure */
    int cap_n;
    float *scores; /* (NH, n, len + n) */
    size_t scores_cap;
    float *x, *ln, *tmp, *q, *knew, *atty, *gate, *up, *rstd, *hrstd, *cos_t, *sin_t;
    int32_t *pos; /* (cap_n) */
};

al_model_kv *al_model_kv_new(const al_model *m, int max_tokens, char *errstr, size_t errlen)
{
    const al_model_config *c = &m->cfg;
    al_model_kv *kv = calloc(1, sizeof *kv);
    if (max_tokens <= 0 || !kv) {
        if (errstr && errlen)
            snprintf(errstr, errlen,
                     max_tokens <= 0 ? "kv cache: max_tokens must be positive"
                                     : "kv cache: out of memory");
        free(kv);
        return NULL;
    }
    kv->L = c->num_layers, kv->max = max_tokens, kv->kvw = c->num_kv_heads * c->head_dim;
    size_t n = (size_t)kv->L * max_tokens * kv->kvw;
    kv->k = malloc(sizeof(float) * n);
    kv->v = malloc(sizeof(float) * n);
    if (!kv->k || !kv->v) {
        if (errstr && errlen)
            snprintf(errstr, errlen, "kv cache: out of memory for %d tokens (%zu MiB)", max_tokens,
                     2 * n * sizeof(float) >> 20);
        al_model_kv_free(kv);
        return NULL;
    }
    return kv;
}

void al_model_kv_free(al_model_kv *kv)
{
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->scratch);
    free(kv->scores);
    free(kv->pos);
    free(kv);
}

void al_model_kv_reset(al_model_kv *kv)
{
    kv->len = 0;
}
int al_model_kv_len(const al_model_kv *kv)
{
    return kv->len;
}
void al_model_kv_truncate(al_model_kv *kv, int len)
{
    if (len >= 0 && len < kv->len) kv->len = len;
}

/* Scratch for n new tokens (grows, never shrinks). */
static int kv_ensure(const al_model_config *c, al_model_kv *kv, int n)
{
    if (n <= kv->cap_n) return 0;
    size_t C = c->hidden_size, I = c->intermediate_size, Q = (size_t)c->num_heads * c->head_dim;
    size_t KV = kv->kvw, t = (size_t)n, half = c->head_dim / 2, NH = c->num_heads;
    size_t sizes[] = {t * C, t * C, t * C, t * Q,  t * KV,   t * Q,
                      t * I, t * I, t,     t * NH, t * half, t * half};
    float **fields[] = {&kv->x,    &kv->ln, &kv->tmp,  &kv->q,     &kv->knew,  &kv->atty,
                        &kv->gate, &kv->up, &kv->rstd, &kv->hrstd, &kv->cos_t, &kv->sin_t};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        total += sizes[i];
    float *mem = malloc(sizeof(float) * total);
    int32_t *pos = malloc(sizeof(int32_t) * t);
    if (!mem || !pos) {
        free(mem);
        free(pos);
        return -1;
    }
    free(kv->scratch);
    free(kv->pos);
    kv->scratch = mem;
    kv->pos = pos;
    for (size_t i = 0, off = 0; i < sizeof sizes / sizeof sizes[0]; off += sizes[i], i++)
        *fields[i] = mem + off;
    kv->cap_n = n;
    return 0;
}

/* Long prompts go through in chunks of this many tokens, which bounds the attention scores
 * at NH * KV_CHUNK * cache length floats. */
#define KV_CHUNK 256

/* One chunk of al_model_kv_forward (inputs already checked). logits NULL: no LM head. */
static int kv_forward_chunk(al_model *m, al_model_kv *kv, const int32_t *tokens, int n,
                            float *logits, int last_only)
{
    const al_model_config *c = &m->cfg;
    int p0 = kv->len, total = p0 + n;
    size_t need = (size_t)c->num_heads * n * total;
    if (kv_ensure(c, kv, n) || ensure_floats(&kv->scores, &kv->scores_cap, need))
        return model_err(m, "kv forward: out of memory");

    int C = c->hidden_size, I = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, Q = NH * HD, KV = kv->kvw, rep = NH / NKV;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    const al_model_weights *p = &m->p;
    for (int t = 0; t < n; t++)
        kv->pos[t] = p0 + t;
    al_rope_tables(kv->cos_t, kv->sin_t, kv->pos, n, HD, c->rope_theta);
    al_embedding_forward(kv->x, tokens, p->embed, n, C);
    for (int l = 0; l < c->num_layers; l++) {
        float *kc = kv->k + (size_t)l * kv->max * KV, *vc = kv->v + (size_t)l * kv->max * KV;
        float *knew = kc + (size_t)p0 * KV, *vnew = vc + (size_t)p0 * KV;
        al_rmsnorm_forward(kv->ln, kv->rstd, kv->x, p->ln1 + (size_t)l * C, n, C, eps);
        al_linear_forward(kv->q, kv->ln, p->wq + (size_t)l * Q * C,
                          p->bq ? p->bq + (size_t)l * Q : NULL, n, C, Q);
        al_linear_forward(c->qk_norm ? kv->knew : knew, kv->ln, p->wk + (size_t)l * KV * C,
                          p->bk ? p->bk + (size_t)l * KV : NULL, n, C, KV);
        al_linear_forward(vnew, kv->ln, p->wv + (size_t)l * KV * C,
                          p->bv ? p->bv + (size_t)l * KV : NULL, n, C, KV);
        if (c->qk_norm) {
            /* in place is fine: each row is read whole before it is written */
            al_rmsnorm_forward(kv->q, kv->hrstd, kv->q, p->q_norm + (size_t)l * HD, n * NH, HD,
                               eps);
            al_rmsnorm_forward(knew, kv->hrstd, kv->knew, p->k_norm + (size_t)l * HD, n * NKV, HD,
                               eps);
        }
        al_rope_forward(kv->q, kv->cos_t, kv->sin_t, n, NH, HD);
        al_rope_forward(knew, kv->cos_t, kv->sin_t, n, NKV, HD);
        for (int h = 0; h < NH; h++)
            al_gemm(0, 1, n, total, HD, scale, kv->q + (size_t)h * HD, Q,
                    kc + (size_t)(h / rep) * HD, KV, 0.0f, kv->scores + (size_t)h * n * total,
                    total);
#pragma omp parallel for schedule(static) if ((size_t)NH * n * total > 16384)
        for (int r = 0; r < NH * n; r++) {
            int last = p0 + r % n; /* query at position p0 + i sees keys 0..p0 + i */
            float *row = kv->scores + (size_t)r * total, mx = row[0], sum = 0.0f;
            for (int j = 1; j <= last; j++)
                mx = row[j] > mx ? row[j] : mx;
            for (int j = 0; j <= last; j++)
                sum += (row[j] = expf(row[j] - mx));
            for (int j = 0; j <= last; j++)
                row[j] /= sum;
            for (int j = last + 1; j < total; j++)
                row[j] = 0.0f;
        }
        for (int h = 0; h < NH; h++)
            al_gemm(0, 0, n, HD, total, 1.0f, kv->scores + (size_t)h * n * total, total,
                    vc + (size_t)(h / rep) * HD, KV, 0.0f, kv->atty + (size_t)h * HD, Q);
        al_linear_forward(kv->tmp, kv->atty, p->wo + (size_t)l * C * Q,
                          p->bo ? p->bo + (size_t)l * C : NULL, n, Q, C);
        al_residual_forward(kv->x, kv->x, kv->tmp, (size_t)n * C);
        al_rmsnorm_forward(kv->ln, kv->rstd, kv->x, p->ln2 + (size_t)l * C, n, C, eps);
        al_linear_forward(kv->gate, kv->ln, p->w_gate + (size_t)l * I * C, NULL, n, C, I);
        al_linear_forward(kv->up, kv->ln, p->w_up + (size_t)l * I * C, NULL, n, C, I);
        al_swiglu_forward(kv->gate, kv->gate, kv->up, (size_t)n * I);
        al_linear_forward(kv->tmp, kv->gate, p->w_down + (size_t)l * C * I, NULL, n, I, C);
        al_residual_forward(kv->x, kv->x, kv->tmp, (size_t)n * C);
    }
    kv->len = total;
    if (!logits) return 0;
    const float *rows = kv->x;
    int nrows = n;
    if (last_only) rows = kv->x + (size_t)(n - 1) * C, nrows = 1;
    al_rmsnorm_forward(kv->ln, kv->rstd, rows, p->ln_f, nrows, C, eps);
    al_lm_head_forward(logits, kv->ln, p->lm_head, nrows, C, c->vocab_size);
    return 0;
}

int al_model_kv_forward(al_model *m, al_model_kv *kv, const int32_t *tokens, int n, float *logits,
                        int last_only)
{
    const al_model_config *c = &m->cfg;
    m->err[0] = 0;
    if (n <= 0) return model_err(m, "kv forward: no tokens");
    if (n > kv->max - kv->len)
        return model_err(m, "kv forward: %d more tokens do not fit the cache (%d of %d used)", n,
                         kv->len, kv->max);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return model_err(m, "kv forward: token %d is outside the vocabulary (%d)", tokens[t],
                             c->vocab_size);
    for (int o = 0; o < n; o += KV_CHUNK) {
        int k = n - o < KV_CHUNK ? n - o : KV_CHUNK, last = o + k == n;
        float *dst = last_only ? (last ? logits : NULL) : logits + (size_t)o * c->vocab_size;
        if (kv_forward_chunk(m, kv, tokens + o, k, dst, last_only)) return -1;
    }
    return 0;
}
