/*
 * model.c: the decoder's parameters and its one forward pass, which training (packed
 * micro-batches, activations kept for backward), prefill chunks and decode steps (rows
 * against KV caches) all run; and the backward pass. Every op goes through the model's
 * backend table (ops.h): the CPU backend by default, CUDA when the model is moved there.
 */
#include "model/model.h"

#include "model/infer.h"
#include "model/layers.h"
#include "model/ops.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Activations of one forward, in backend memory. In training every per-layer array is
 * stacked over L, (L, T, width), and kept for backward; in serving one layer's worth is
 * reused by every layer (the layer stride is 0). Element types: `act` unless noted f32. */
typedef struct acts {
    void *res;       /* (L+1, T, C) residual stream entering each layer; [L] enters the final norm */
    void *res_mid;   /* (L, T, C) residual after attention */
    void *ln1;       /* (L, T, C) */
    float *ln1_rstd; /* (L, T) */
    void *q_pre;     /* (L, T, NH*HD) q before its norm (qk_norm only; serving: == q) */
    void *k_pre;     /* (L, T, NKV*HD) */
    float *qn_rstd;  /* (L, T*NH) */
    float *kn_rstd;  /* (L, T*NKV) */
    void *q;         /* (L, T, NH*HD) q as attention sees it (normed, rotated) */
    void *k;         /* (L, T, NKV*HD) */
    void *v;         /* (L, T, NKV*HD) */
    void *atty;      /* (L, T, NH*HD) attention output before o_proj */
    void *ln2;       /* (L, T, C) */
    float *ln2_rstd; /* (L, T) */
    void *gate;      /* (L, T, I) */
    void *up;        /* (L, T, I) */
    void *lnf;       /* (T, C) */
    float *lnf_rstd; /* (T) */
    float *rope_cos; /* (T, HD/2) */
    float *rope_sin; /* (T, HD/2) */
    void *tmp;       /* (T, C) o_proj and down_proj outputs before their residual add */
    void *h;         /* (T, I) silu(gate) * up (serving: == gate) */
    /* backward scratch (training only) */
    void *dres;  /* (T, C) */
    void *dln;   /* (T, C) */
    void *dq;    /* (T, NH*HD) */
    void *dq2;   /* (T, NH*HD) */
    void *dk;    /* (T, NKV*HD) */
    void *dk2;   /* (T, NKV*HD) */
    void *dv;    /* (T, NKV*HD) */
    void *dbig;  /* (T, max(I, NH*HD)) d of atty or of h */
    void *dgate; /* (T, I); also silu(gate) * up, recomputed rather than kept per layer */
    void *dup;   /* (T, I) */
} acts;

/* Where the valid copy of an array is. */
enum { ON_HOST = 1, ON_BACKEND = 2, ON_BOTH = 3 };

/* Logits are computed (and kept, in training) for at most this many bytes of rows at once on a
 * device backend; the CPU does every row in one go. */
#define DEVICE_LOGITS_BUDGET ((size_t)1 << 30)

struct al_model {
    al_model_config cfg;
    size_t nparams;
    float *params_mem, *grads_mem; /* host, f32 */
    al_model_weights p, g;         /* views into them */
    al_model_tensor *tensors;
    size_t ntensors;

    /* the backend and its copies (the host arrays themselves on the CPU) */
    al_backend *be;
    size_t esz;      /* bytes per act element */
    int host;        /* the backend works on the host arrays directly */
    void *dw;        /* (nparams) act: the weights the forward reads */
    float *dmaster;  /* (nparams) f32 master weights the optimizer updates */
    float *dgrads;   /* (nparams) f32 */
    int params_at, grads_at;

    /* training activations */
    void *act_mem;
    size_t act_bytes;
    int cap_T;
    acts a;
    void *att_scratch;
    size_t scratch_cap;

    /* the last forward's batch, for backward */
    int T, nseq, have_forward;
    int32_t *tokens_h, *cu_h; /* host copies */
    int32_t *tokens_d, *cu_d, *pos_d; /* backend copies (== host ones on the CPU) */
    int tok_cap, seq_cap;

    /* head of the trainer's path: logits (rows, V) f32 and per-token values, backend memory */
    float *logits_d;
    size_t logits_cap; /* bytes */
    int32_t *targets_d;
    float *logp_d, *ent_d, *dlogp_d, *dent_d;
    int head_cap, head_rows; /* rows per logits chunk; T when one chunk holds them all */
    float temperature;
    int have_logprob, kept_logits;

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

/* The backend's view of a host parameter (or gradient) pointer: the same offset in its
 * copy. NULL stays NULL (absent biases). */
static const void *WP(const al_model *m, const float *host)
{
    if (!host) return NULL;
    if (m->host) return host;
    return (const char *)m->dw + (size_t)(host - m->params_mem) * m->esz;
}
static float *GP(const al_model *m, const float *host_grad)
{
    if (!host_grad) return NULL;
    return m->dgrads + (host_grad - m->grads_mem);
}
/* act pointer arithmetic */
#define AP(m, ptr, n) ((void *)((char *)(ptr) + (size_t)(n) * (m)->esz))

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

/* Brings the host copy of the parameters up to date (a device backend's updates come down).
 * The caller may write through the pointer, so the backend's copy counts as stale after. */
float *al_model_params(al_model *m)
{
    if (!m->host) {
        if (!(m->params_at & ON_HOST)) m->be->ops->download(m->be, m->params_mem, m->dmaster, sizeof(float) * m->nparams);
        m->params_at = ON_HOST;
    }
    return m->params_mem;
}
const float *al_model_params_read(al_model *m)
{
    if (!m->host && !(m->params_at & ON_HOST)) {
        m->be->ops->download(m->be, m->params_mem, m->dmaster, sizeof(float) * m->nparams);
        m->params_at = ON_BOTH;
    }
    return m->params_mem;
}

float *al_model_grads(al_model *m)
{
    if (!m->host) {
        if (!(m->grads_at & ON_HOST)) m->be->ops->download(m->be, m->grads_mem, m->dgrads, sizeof(float) * m->nparams);
        m->grads_at = ON_HOST;
    }
    return m->grads_mem;
}

/* Brings the backend's copies up to date before it computes. */
static void params_to_backend(al_model *m)
{
    if (m->host || (m->params_at & ON_BACKEND)) return;
    const al_backend_ops *o = m->be->ops;
    o->upload(m->be, m->dmaster, m->params_mem, sizeof(float) * m->nparams);
    o->weights_from_master(m->be, m->dw, m->dmaster, m->nparams);
    m->params_at = ON_BOTH;
}
static void grads_to_backend(al_model *m)
{
    if (m->host || (m->grads_at & ON_BACKEND)) return;
    m->be->ops->upload(m->be, m->dgrads, m->grads_mem, sizeof(float) * m->nparams);
    m->grads_at = ON_BOTH;
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
    return m->act_bytes + m->scratch_cap + m->logits_cap;
}

al_backend *al_model_backend(const al_model *m)
{
    return m->be;
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
    m->be = al_backend_cpu();
    m->esz = sizeof(float), m->host = 1;
    m->dw = m->params_mem, m->dmaster = m->params_mem, m->dgrads = m->grads_mem;
    m->params_at = m->grads_at = ON_BOTH;
    return m;
oom:
    if (errstr && errlen)
        snprintf(errstr, errlen, "model: out of memory for %zu parameters",
                 al_model_config_num_params(cfg));
    al_model_free(m);
    return NULL;
}

/* Frees everything the model holds on its backend (not the host arrays). */
static void backend_release(al_model *m)
{
    al_backend *b = m->be;
    if (!b) return;
    void (*f)(al_backend *, void *) = b->ops->free;
    f(b, m->act_mem);
    f(b, m->att_scratch);
    f(b, m->logits_d);
    f(b, m->targets_d);
    f(b, m->logp_d);
    f(b, m->ent_d);
    f(b, m->dlogp_d);
    f(b, m->dent_d);
    if (!m->host) {
        f(b, m->tokens_d);
        f(b, m->cu_d);
        f(b, m->pos_d);
        f(b, m->dw);
        f(b, m->dmaster);
        f(b, m->dgrads);
    }
    m->act_mem = m->att_scratch = NULL;
    m->logits_d = m->logp_d = m->ent_d = m->dlogp_d = m->dent_d = NULL;
    m->targets_d = m->tokens_d = m->cu_d = m->pos_d = NULL;
    m->act_bytes = m->scratch_cap = m->logits_cap = 0;
    m->cap_T = m->head_cap = 0;
    m->tok_cap = m->seq_cap = 0;
    m->have_forward = m->have_logprob = 0;
}

int al_model_set_backend(al_model *m, al_backend *b, char *errstr, size_t errlen)
{
    if (!b) b = al_backend_cpu();
    if (b == m->be) return 0;
    float *params = al_model_params(m), *grads = al_model_grads(m); /* host copies current */
    backend_release(m);
    free(m->tokens_h), free(m->cu_h);
    m->tokens_h = m->cu_h = NULL;
    m->be = b;
    m->esz = b->ops->act_bytes;
    m->host = b->ops->host_memory && m->esz == sizeof(float);
    if (m->host) {
        m->dw = params, m->dmaster = params, m->dgrads = grads;
        m->params_at = m->grads_at = ON_BOTH;
        return 0;
    }
    m->dw = b->ops->alloc(b, m->esz * m->nparams);
    m->dmaster = b->ops->alloc(b, sizeof(float) * m->nparams);
    m->dgrads = b->ops->alloc(b, sizeof(float) * m->nparams);
    if (!m->dw || !m->dmaster || !m->dgrads) {
        snprintf(errstr, errlen, "model: out of %s memory for %zu parameters", b->ops->name,
                 m->nparams);
        backend_release(m);
        m->be = al_backend_cpu(), m->esz = sizeof(float), m->host = 1;
        m->dw = m->dmaster = params, m->dgrads = grads;
        m->params_at = m->grads_at = ON_BOTH;
        return -1;
    }
    m->params_at = m->grads_at = ON_HOST;
    params_to_backend(m);
    grads_to_backend(m);
    return 0;
}

void al_model_free(al_model *m)
{
    if (!m) return;
    backend_release(m);
    free(m->params_mem);
    free(m->grads_mem);
    free(m->tensors);
    free(m->tokens_h);
    free(m->cu_h);
    free(m);
}

void al_model_zero_grad(al_model *m)
{
    m->be->ops->zero(m->be, m->dgrads, sizeof(float) * m->nparams);
    m->grads_at = m->host ? ON_BOTH : ON_BACKEND;
}

void al_model_params_changed(al_model *m)
{
    if (!m->host) m->params_at = ON_HOST;
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
            /* Draw k of the stream is splitmix64's output for state s0 + k * its increment,
             * so pairs are computed independently (in parallel: a 0.5B model's init takes
             * seconds, not tens of them) and come out as the sequential loop made them. */
            uint64_t s0 = seed ^ (0xA24BAED4963EE407ULL * (i + 1));
            size_t pairs = (t->numel + 1) / 2;
#pragma omp parallel for schedule(static) if (pairs > 65536)
            for (size_t p = 0; p < pairs; p++) {
                uint64_t a = s0 + (2 * p) * 0x9E3779B97F4A7C15ULL;
                uint64_t b = a + 0x9E3779B97F4A7C15ULL;
                double u1 = uniform01(&a), u2 = uniform01(&b);
                double r = sqrt(-2.0 * log(u1)) * 0.02;
                size_t j = 2 * p;
                w[j] = (float)(r * cos(6.283185307179586 * u2));
                if (j + 1 < t->numel) w[j + 1] = (float)(r * sin(6.283185307179586 * u2));
            }
        }
    }
    if (!m->host) m->params_at = ON_HOST;
}


/* Byte sizes of the activation fields for T rows: stacked over layers in training, one layer
 * in serving (then q_pre, k_pre and h alias q, k and gate, and nothing of backward exists).
 * Fills sizes in the order of the acts struct; returns the number of fields. */
#define NACTS 32
static int acts_sizes(const al_model *m, size_t t, int training, size_t sizes[NACTS])
{
    const al_model_config *c = &m->cfg;
    size_t C = c->hidden_size, I = c->intermediate_size, L = training ? c->num_layers : 1;
    size_t Q = (size_t)c->num_heads * c->head_dim, KV = (size_t)c->num_kv_heads * c->head_dim;
    size_t NH = c->num_heads, NKV = c->num_kv_heads, half = c->head_dim / 2;
    size_t e = m->esz, f = sizeof(float), big = I > Q ? I : Q, qk = c->qk_norm && training;
    size_t bw = training ? 1 : 0;
    size_t s[NACTS] = {
        (L + bw) * t * C * e, /* res */
        bw * L * t * C * e,   /* res_mid */
        L * t * C * e,        /* ln1 */
        L * t * f,            /* ln1_rstd */
        qk * L * t * Q * e,   /* q_pre */
        qk * L * t * KV * e,  /* k_pre */
        (c->qk_norm ? L * t * NH : 0) * f,
        (c->qk_norm ? L * t * NKV : 0) * f,
        L * t * Q * e,  /* q */
        L * t * KV * e, /* k */
        L * t * KV * e, /* v */
        L * t * Q * e,  /* atty */
        L * t * C * e,  /* ln2 */
        L * t * f,      /* ln2_rstd */
        L * t * I * e,  /* gate */
        L * t * I * e,  /* up */
        t * C * e,      /* lnf */
        t * f,          /* lnf_rstd */
        t * half * f,
        t * half * f,
        t * C * e,         /* tmp */
        0,                 /* h: training uses dgate, serving gate */
        bw * t * C * e,    /* dres */
        bw * t * C * e,    /* dln */
        bw * t * Q * e,    /* dq */
        bw * qk * t * Q * e,
        bw * t * KV * e,   /* dk */
        bw * qk * t * KV * e,
        bw * t * KV * e,   /* dv */
        bw * t * big * e,  /* dbig */
        bw * t * I * e,    /* dgate */
        bw * t * I * e,    /* dup */
    };
    memcpy(sizes, s, sizeof s);
    return NACTS;
}

/* Bytes of one block holding the fields of acts_sizes, each piece 256-byte aligned. */
static size_t acts_total(const size_t sizes[NACTS])
{
    size_t off = 0;
    for (int i = 0; i < NACTS; i++)
        off += (sizes[i] + 255) & ~(size_t)255;
    return off;
}

/* Points the fields of *a into `mem`, laid out as acts_total counts it. */
static void acts_carve(const size_t sizes[NACTS], void *mem, acts *a)
{
    void **fields[NACTS] = {
        &a->res,   &a->res_mid, &a->ln1,  (void **)&a->ln1_rstd, &a->q_pre,
        &a->k_pre, (void **)&a->qn_rstd,  (void **)&a->kn_rstd,  &a->q,
        &a->k,     &a->v,       &a->atty, &a->ln2,  (void **)&a->ln2_rstd,
        &a->gate,  &a->up,      &a->lnf,  (void **)&a->lnf_rstd, (void **)&a->rope_cos,
        (void **)&a->rope_sin,  &a->tmp,  &a->h,    &a->dres,    &a->dln,
        &a->dq,    &a->dq2,     &a->dk,   &a->dk2,  &a->dv,      &a->dbig,
        &a->dgate, &a->dup,
    };
    _Static_assert(sizeof fields / sizeof fields[0] == NACTS, "one pointer per activation");
    size_t off = 0;
    for (int i = 0; i < NACTS; i++) {
        *fields[i] = sizes[i] ? (char *)mem + off : NULL;
        off += (sizes[i] + 255) & ~(size_t)255;
    }
    if (!a->q_pre) a->q_pre = a->q;
    if (!a->k_pre) a->k_pre = a->k;
    if (!a->h) a->h = a->gate;
    if (!a->res_mid) a->res_mid = a->res;
}

/* Grows the training activations to hold T tokens (no-op when they already do). */
static int ensure_acts(al_model *m, int T)
{
    if (T <= m->cap_T) return 0;
    size_t sizes[NACTS];
    acts_sizes(m, (size_t)T, 1, sizes);
    size_t total = acts_total(sizes);
    void *mem = m->be->ops->alloc(m->be, total);
    if (!mem) return model_err(m, "model: out of %s memory for activations of %d tokens", m->be->ops->name, T);
    m->be->ops->free(m->be, m->act_mem);
    m->act_mem = mem;
    m->act_bytes = total;
    acts_carve(sizes, mem, &m->a);
    m->cap_T = T;
    return 0;
}

/* A backend buffer of at least `bytes` (grows, never shrinks). 0, or -1 when out of memory. */
static int ensure_buf(al_backend *b, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return 0;
    void *p = b->ops->alloc(b, bytes);
    if (!p) return -1;
    b->ops->free(b, *buf);
    *buf = p;
    *cap = bytes;
    return 0;
}

/* One forward over rows of several sequences (see the top of the file). */
typedef struct fwd_in {
    int T;
    const int32_t *tokens_d;    /* (T) backend */
    int nseq;
    const int32_t *cu_d;        /* (nseq + 1) backend; training only */
    const int32_t *cu_h;        /* (nseq + 1) host; training only */
    al_kv *const *kvs;          /* (nseq) serving: caches; NULL: training */
    const int *cu_rows;         /* (nseq + 1) host row offsets; serving only */
    const int32_t *positions_h; /* (T) host, for the rotary tables */
} fwd_in;

/* The decoder up to the final norm's input: a->res[L] in training (each layer's
 * activations kept), a->res (one layer) in serving. a's buffers hold T rows. */
static void forward_layers(const al_model *m, acts *a, void *att_scratch, const fwd_in *in)
{
    const al_model_config *c = &m->cfg;
    al_backend *b = m->be;
    const al_backend_ops *o = b->ops;
    int T = in->T, training = in->kvs == NULL;
    int C = c->hidden_size, I = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, Q = NH * HD, KV = NKV * HD;
    size_t ls = training ? 1 : 0; /* layer stride multiplier */
    size_t tC = (size_t)T * C * ls, tQ = (size_t)T * Q * ls, tKV = (size_t)T * KV * ls;
    size_t tI = (size_t)T * I * ls, tR = (size_t)T * ls;
    float eps = (float)c->rms_norm_eps;
    const al_model_weights *p = &m->p;

    /* rotary tables on the host, then to the backend */
    if (o->host_memory) {
        al_rope_tables(a->rope_cos, a->rope_sin, in->positions_h, T, HD, c->rope_theta);
    } else {
        size_t n = (size_t)T * (HD / 2);
        float *tab = malloc(sizeof(float) * 2 * (n ? n : 1));
        if (!tab) abort(); /* (T, HD) floats: far below what the activations took */
        al_rope_tables(tab, tab + n, in->positions_h, T, HD, c->rope_theta);
        o->upload(b, a->rope_cos, tab, sizeof(float) * n);
        o->upload(b, a->rope_sin, tab + n, sizeof(float) * n);
        free(tab);
    }
    o->embedding_forward(b, a->res, in->tokens_d, WP(m, p->embed), T, C);
    for (int l = 0; l < c->num_layers; l++) {
        void *x = AP(m, a->res, l * tC), *ln1 = AP(m, a->ln1, l * tC);
        void *q = AP(m, a->q, l * tQ), *k = AP(m, a->k, l * tKV), *v = AP(m, a->v, l * tKV);
        void *atty = AP(m, a->atty, l * tQ), *mid = training ? AP(m, a->res_mid, l * tC) : x;
        void *ln2 = AP(m, a->ln2, l * tC), *gate = AP(m, a->gate, l * tI);
        void *up = AP(m, a->up, l * tI), *h = training ? a->dgate : gate;
        void *next = training ? AP(m, a->res, (l + 1) * tC) : x;
        o->rmsnorm_forward(b, ln1, a->ln1_rstd + l * tR, x, WP(m, p->ln1 + (size_t)l * C), T, C,
                           eps);
        void *qp = c->qk_norm && training ? AP(m, a->q_pre, l * tQ) : q;
        void *kp = c->qk_norm && training ? AP(m, a->k_pre, l * tKV) : k;
        o->linear_forward(b, qp, ln1, WP(m, p->wq + (size_t)l * Q * C),
                          WP(m, p->bq ? p->bq + (size_t)l * Q : NULL), T, C, Q);
        o->linear_forward(b, kp, ln1, WP(m, p->wk + (size_t)l * KV * C),
                          WP(m, p->bk ? p->bk + (size_t)l * KV : NULL), T, C, KV);
        if (c->qk_norm) {
            /* in place in serving: each row is read whole before it is written */
            o->rmsnorm_forward(b, q, a->qn_rstd + l * tR * NH, qp, WP(m, p->q_norm + (size_t)l * HD),
                               T * NH, HD, eps);
            o->rmsnorm_forward(b, k, a->kn_rstd + l * tR * NKV, kp,
                               WP(m, p->k_norm + (size_t)l * HD), T * NKV, HD, eps);
        }
        o->linear_forward(b, v, ln1, WP(m, p->wv + (size_t)l * KV * C),
                          WP(m, p->bv ? p->bv + (size_t)l * KV : NULL), T, C, KV);
        o->rope_forward(b, q, a->rope_cos, a->rope_sin, T, NH, HD);
        o->rope_forward(b, k, a->rope_cos, a->rope_sin, T, NKV, HD);
        if (training)
            o->attention_forward(b, atty, att_scratch, q, k, v, in->cu_d, in->cu_h, in->nseq, NH,
                                 NKV, HD);
        else
            o->attention_kv(b, l, atty, q, k, v, in->kvs, in->nseq, in->cu_rows, NH, NKV, HD);
        o->linear_forward(b, a->tmp, atty, WP(m, p->wo + (size_t)l * C * Q),
                          WP(m, p->bo ? p->bo + (size_t)l * C : NULL), T, Q, C);
        o->residual_forward(b, mid, x, a->tmp, (size_t)T * C);
        o->rmsnorm_forward(b, ln2, a->ln2_rstd + l * tR, mid, WP(m, p->ln2 + (size_t)l * C), T, C,
                           eps);
        o->linear_forward(b, gate, ln2, WP(m, p->w_gate + (size_t)l * I * C), NULL, T, C, I);
        o->linear_forward(b, up, ln2, WP(m, p->w_up + (size_t)l * I * C), NULL, T, C, I);
        o->swiglu_forward(b, h, gate, up, (size_t)T * I);
        o->linear_forward(b, a->tmp, h, WP(m, p->w_down + (size_t)l * C * I), NULL, T, I, C);
        o->residual_forward(b, next, mid, a->tmp, (size_t)T * C);
    }
}

/* Checks a packed batch and copies it (host and backend) for backward. 0 or -1. */
static int take_batch(al_model *m, const int32_t *tokens, const int32_t *positions,
                      const int32_t *cu_seqlens, int nseq, int T)
{
    const al_model_config *c = &m->cfg;
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
    al_backend *b = m->be;
    size_t scratch = b->ops->attention_scratch_bytes(b, cu_seqlens, nseq, c->num_heads, c->head_dim);
    if (ensure_acts(m, T) || ensure_buf(b, &m->att_scratch, &m->scratch_cap, scratch)) {
        if (!m->err[0]) model_err(m, "model: out of memory for attention of %d tokens", T);
        return -1;
    }
    if (T > m->tok_cap || nseq + 1 > m->seq_cap) {
        int tc = T > m->tok_cap ? T : m->tok_cap, sc = nseq + 1 > m->seq_cap ? nseq + 1 : m->seq_cap;
        int32_t *th = malloc(sizeof(int32_t) * (size_t)tc), *ch = malloc(sizeof(int32_t) * (size_t)sc);
        int32_t *td = th, *cd = ch, *pd = NULL;
        if (!m->host && th && ch) {
            td = b->ops->alloc(b, sizeof(int32_t) * (size_t)tc);
            cd = b->ops->alloc(b, sizeof(int32_t) * (size_t)sc);
            pd = b->ops->alloc(b, sizeof(int32_t) * (size_t)tc);
        }
        if (!th || !ch || !td || !cd || (!m->host && !pd)) {
            free(th), free(ch);
            if (!m->host) b->ops->free(b, td), b->ops->free(b, cd), b->ops->free(b, pd);
            return model_err(m, "model: out of memory");
        }
        free(m->tokens_h), free(m->cu_h);
        if (!m->host) b->ops->free(b, m->tokens_d), b->ops->free(b, m->cu_d), b->ops->free(b, m->pos_d);
        m->tokens_h = th, m->cu_h = ch, m->tokens_d = td, m->cu_d = cd, m->pos_d = pd;
        m->tok_cap = tc, m->seq_cap = sc;
    }
    memcpy(m->tokens_h, tokens, sizeof(int32_t) * (size_t)T);
    memcpy(m->cu_h, cu_seqlens, sizeof(int32_t) * (size_t)(nseq + 1));
    if (!m->host) {
        b->ops->upload(b, m->tokens_d, tokens, sizeof(int32_t) * (size_t)T);
        b->ops->upload(b, m->cu_d, cu_seqlens, sizeof(int32_t) * (size_t)(nseq + 1));
    }
    m->T = T, m->nseq = nseq;
    return 0;
}

/* The training forward through the final norm (lnf holds its output). */
static int forward_train(al_model *m, const int32_t *tokens, const int32_t *positions,
                         const int32_t *cu_seqlens, int nseq, int T)
{
    m->have_forward = m->have_logprob = 0;
    m->err[0] = 0;
    if (take_batch(m, tokens, positions, cu_seqlens, nseq, T)) return -1;
    params_to_backend(m);
    fwd_in in = {.T = T, .tokens_d = m->tokens_d, .nseq = nseq, .cu_d = m->cu_d,
                 .cu_h = m->cu_h, .positions_h = positions};
    forward_layers(m, &m->a, m->att_scratch, &in);
    const al_model_config *c = &m->cfg;
    m->be->ops->rmsnorm_forward(m->be, m->a.lnf, m->a.lnf_rstd,
                                AP(m, m->a.res, (size_t)c->num_layers * T * c->hidden_size),
                                WP(m, m->p.ln_f), T, c->hidden_size, (float)c->rms_norm_eps);
    m->have_forward = 1;
    return 0;
}

int al_model_forward(al_model *m, const int32_t *tokens, const int32_t *positions,
                     const int32_t *cu_seqlens, int nseq, int T, float *logits)
{
    if (forward_train(m, tokens, positions, cu_seqlens, nseq, T)) return -1;
    const al_model_config *c = &m->cfg;
    al_backend *b = m->be;
    float *dst = logits;
    if (!m->host) {
        if (ensure_buf(b, (void **)&m->logits_d, &m->logits_cap,
                       sizeof(float) * (size_t)T * c->vocab_size)) {
            m->have_forward = 0;
            return model_err(m, "model: out of %s memory for %d rows of logits", b->ops->name, T);
        }
        dst = m->logits_d;
    }
    b->ops->lm_head_forward(b, dst, m->a.lnf, WP(m, m->p.lm_head), T, c->hidden_size, c->vocab_size);
    if (!m->host)
        b->ops->download(b, logits, dst, sizeof(float) * (size_t)T * c->vocab_size);
    return 0;
}

/* Rows of logits one chunk of the head holds: all T on the host; on a device as many as
 * DEVICE_LOGITS_BUDGET allows (at least 1). */
static int head_rows_for(const al_model *m, int T)
{
    if (m->host) return T;
    size_t per = sizeof(float) * (size_t)m->cfg.vocab_size;
    size_t rows = DEVICE_LOGITS_BUDGET / per;
    if (rows < 1) rows = 1;
    return rows < (size_t)T ? (int)rows : T;
}

/* Per-token buffers of the trainer's head for T rows (backend memory). 0 or -1. */
static int ensure_head(al_model *m, int T)
{
    al_backend *b = m->be;
    int rows = head_rows_for(m, T);
    if (ensure_buf(b, (void **)&m->logits_d, &m->logits_cap,
                   sizeof(float) * (size_t)rows * m->cfg.vocab_size))
        return model_err(m, "model: out of %s memory for %d rows of logits", b->ops->name, rows);
    if (T > m->head_cap) {
        void **bufs[5] = {(void **)&m->targets_d, (void **)&m->logp_d, (void **)&m->ent_d,
                          (void **)&m->dlogp_d, (void **)&m->dent_d};
        for (int i = 0; i < 5; i++) {
            void *p = b->ops->alloc(b, sizeof(float) * (size_t)T);
            if (!p) return model_err(m, "model: out of %s memory", b->ops->name);
            b->ops->free(b, *bufs[i]);
            *bufs[i] = p;
        }
        m->head_cap = T;
    }
    m->head_rows = rows;
    return 0;
}

int al_model_forward_logprob(al_model *m, const int32_t *tokens, const int32_t *positions,
                             const int32_t *cu_seqlens, int nseq, int T, const int32_t *targets,
                             float temperature, float *logp, float *entropy)
{
    const al_model_config *c = &m->cfg;
    int V = c->vocab_size, C = c->hidden_size;
    if (!(temperature > 0.0f) || !isfinite(temperature))
        return model_err(m, "model: temperature must be > 0 (got %g)", (double)temperature);
    for (int t = 0; t < T; t++)
        if (targets[t] >= V)
            return model_err(m,
                             "logprob: target token %d at position %d is outside the vocabulary "
                             "(size %d)",
                             (int)targets[t], t, V);
    if (forward_train(m, tokens, positions, cu_seqlens, nseq, T)) return -1;
    if (ensure_head(m, T)) {
        m->have_forward = 0;
        return -1;
    }
    al_backend *b = m->be;
    const al_backend_ops *o = b->ops;
    o->upload(b, m->targets_d, targets, sizeof(int32_t) * (size_t)T);
    for (int r0 = 0; r0 < T; r0 += m->head_rows) {
        int n = T - r0 < m->head_rows ? T - r0 : m->head_rows;
        o->lm_head_forward(b, m->logits_d, AP(m, m->a.lnf, (size_t)r0 * C), WP(m, m->p.lm_head),
                           n, C, V);
        o->logprob_forward(b, m->logits_d, m->targets_d + r0, n, V, temperature, m->logp_d + r0,
                           entropy ? m->ent_d + r0 : NULL);
    }
    o->download(b, logp, m->logp_d, sizeof(float) * (size_t)T);
    if (entropy) o->download(b, entropy, m->ent_d, sizeof(float) * (size_t)T);
    m->temperature = temperature;
    m->kept_logits = m->head_rows >= T; /* one chunk: the logits are still there */
    m->have_logprob = 1;
    return 0;
}

/* The backward from d loss / d(final norm output) in a->dln through every layer. */
static void backward_layers(al_model *m)
{
    const al_model_config *c = &m->cfg;
    al_backend *b = m->be;
    const al_backend_ops *o = b->ops;
    int T = m->T, C = c->hidden_size, I = c->intermediate_size, NH = c->num_heads;
    int NKV = c->num_kv_heads, HD = c->head_dim, Q = NH * HD, KV = NKV * HD;
    size_t tC = (size_t)T * C, tQ = (size_t)T * Q, tKV = (size_t)T * KV, tI = (size_t)T * I;
    size_t e = m->esz;
    acts *a = &m->a;
    const al_model_weights *p = &m->p;
    const al_model_weights *g = &m->g;

    o->zero(b, a->dres, e * tC);
    o->rmsnorm_backward(b, a->dres, GP(m, g->ln_f), a->dln, AP(m, a->res, (size_t)c->num_layers * tC),
                        WP(m, p->ln_f), a->lnf_rstd, T, C);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        const void *x = AP(m, a->res, l * tC), *ln1 = AP(m, a->ln1, l * tC);
        const void *q = AP(m, a->q, l * tQ), *k = AP(m, a->k, l * tKV), *v = AP(m, a->v, l * tKV);
        const void *atty = AP(m, a->atty, l * tQ), *mid = AP(m, a->res_mid, l * tC);
        const void *ln2 = AP(m, a->ln2, l * tC);
        const void *gate = AP(m, a->gate, l * tI), *up = AP(m, a->up, l * tI);
        /* MLP branch: res[l+1] = mid + down(swiglu(gate(ln2), up(ln2))); the product h is
         * recomputed into dgate's buffer, which swiglu's backward then overwrites. */
        o->swiglu_forward(b, a->dgate, gate, up, tI);
        o->zero(b, a->dbig, e * tI);
        o->linear_backward(b, a->dbig, GP(m, g->w_down + (size_t)l * C * I), NULL, a->dres, a->dgate,
                           WP(m, p->w_down + (size_t)l * C * I), T, I, C);
        o->swiglu_backward(b, a->dgate, a->dup, a->dbig, gate, up, tI);
        o->zero(b, a->dln, e * tC);
        o->linear_backward(b, a->dln, GP(m, g->w_gate + (size_t)l * I * C), NULL, a->dgate, ln2,
                           WP(m, p->w_gate + (size_t)l * I * C), T, C, I);
        o->linear_backward(b, a->dln, GP(m, g->w_up + (size_t)l * I * C), NULL, a->dup, ln2,
                           WP(m, p->w_up + (size_t)l * I * C), T, C, I);
        o->rmsnorm_backward(b, a->dres, GP(m, g->ln2 + (size_t)l * C), a->dln, mid,
                            WP(m, p->ln2 + (size_t)l * C), a->ln2_rstd + (size_t)l * T, T, C);
        /* attention branch: mid = x + o(attention(rope(norm(q(ln1))), ...)) */
        o->zero(b, a->dbig, e * tQ);
        o->linear_backward(b, a->dbig, GP(m, g->wo + (size_t)l * C * Q),
                           GP(m, g->bo ? g->bo + (size_t)l * C : NULL), a->dres, atty,
                           WP(m, p->wo + (size_t)l * C * Q), T, Q, C);
        o->attention_backward(b, a->dq, a->dk, a->dv, m->att_scratch, a->dbig, atty, q, k, v, m->cu_d,
                              m->cu_h, m->nseq, NH, NKV, HD);
        o->rope_backward(b, a->dq, a->rope_cos, a->rope_sin, T, NH, HD);
        o->rope_backward(b, a->dk, a->rope_cos, a->rope_sin, T, NKV, HD);
        void *dq = a->dq, *dk = a->dk;
        if (c->qk_norm) {
            o->zero(b, a->dq2, e * tQ);
            o->zero(b, a->dk2, e * tKV);
            o->rmsnorm_backward(b, a->dq2, GP(m, g->q_norm + (size_t)l * HD), a->dq,
                                AP(m, a->q_pre, l * tQ), WP(m, p->q_norm + (size_t)l * HD),
                                a->qn_rstd + (size_t)l * T * NH, T * NH, HD);
            o->rmsnorm_backward(b, a->dk2, GP(m, g->k_norm + (size_t)l * HD), a->dk,
                                AP(m, a->k_pre, l * tKV), WP(m, p->k_norm + (size_t)l * HD),
                                a->kn_rstd + (size_t)l * T * NKV, T * NKV, HD);
            dq = a->dq2, dk = a->dk2;
        }
        o->zero(b, a->dln, e * tC);
        o->linear_backward(b, a->dln, GP(m, g->wq + (size_t)l * Q * C),
                           GP(m, g->bq ? g->bq + (size_t)l * Q : NULL), dq, ln1,
                           WP(m, p->wq + (size_t)l * Q * C), T, C, Q);
        o->linear_backward(b, a->dln, GP(m, g->wk + (size_t)l * KV * C),
                           GP(m, g->bk ? g->bk + (size_t)l * KV : NULL), dk, ln1,
                           WP(m, p->wk + (size_t)l * KV * C), T, C, KV);
        o->linear_backward(b, a->dln, GP(m, g->wv + (size_t)l * KV * C),
                           GP(m, g->bv ? g->bv + (size_t)l * KV : NULL), a->dv, ln1,
                           WP(m, p->wv + (size_t)l * KV * C), T, C, KV);
        o->rmsnorm_backward(b, a->dres, GP(m, g->ln1 + (size_t)l * C), a->dln, x,
                            WP(m, p->ln1 + (size_t)l * C), a->ln1_rstd + (size_t)l * T, T, C);
    }
    o->embedding_backward(b, GP(m, g->embed), a->dres, m->tokens_d, T, C);
}

int al_model_backward(al_model *m, const float *dlogits)
{
    if (!m->have_forward) return model_err(m, "model: backward without a forward");
    const al_model_config *c = &m->cfg;
    al_backend *b = m->be;
    int T = m->T, C = c->hidden_size, V = c->vocab_size;
    grads_to_backend(m);
    const float *dl = dlogits;
    if (!m->host) {
        if (ensure_buf(b, (void **)&m->logits_d, &m->logits_cap, sizeof(float) * (size_t)T * V))
            return model_err(m, "model: out of %s memory for %d rows of logits", b->ops->name, T);
        b->ops->upload(b, m->logits_d, dlogits, sizeof(float) * (size_t)T * V);
        dl = m->logits_d;
    }
    b->ops->zero(b, m->a.dln, m->esz * (size_t)T * C);
    b->ops->lm_head_backward(b, m->a.dln, GP(m, m->g.lm_head), dl, m->a.lnf, WP(m, m->p.lm_head),
                             T, C, V);
    backward_layers(m);
    m->grads_at = m->host ? ON_BOTH : ON_BACKEND;
    return 0;
}

int al_model_backward_logprob(al_model *m, const float *dlogp, const float *dentropy)
{
    if (!m->have_logprob) return model_err(m, "model: backward without a logprob forward");
    const al_model_config *c = &m->cfg;
    al_backend *b = m->be;
    const al_backend_ops *o = b->ops;
    int T = m->T, C = c->hidden_size, V = c->vocab_size;
    grads_to_backend(m);
    if (dlogp) o->upload(b, m->dlogp_d, dlogp, sizeof(float) * (size_t)T);
    if (dentropy) o->upload(b, m->dent_d, dentropy, sizeof(float) * (size_t)T);
    o->zero(b, m->a.dln, m->esz * (size_t)T * C);
    for (int r0 = 0; r0 < T; r0 += m->head_rows) {
        int n = T - r0 < m->head_rows ? T - r0 : m->head_rows;
        const void *x = AP(m, m->a.lnf, (size_t)r0 * C);
        if (!m->kept_logits) /* recomputed: the chunk's logits were overwritten */
            o->lm_head_forward(b, m->logits_d, x, WP(m, m->p.lm_head), n, C, V);
        o->logprob_backward(b, m->logits_d, m->targets_d + r0, n, V, m->temperature,
                            dlogp ? m->dlogp_d + r0 : NULL, dentropy ? m->dent_d + r0 : NULL,
                            m->logits_d);
        o->lm_head_backward(b, AP(m, m->a.dln, (size_t)r0 * C), GP(m, m->g.lm_head), m->logits_d,
                            x, WP(m, m->p.lm_head), n, C, V);
    }
    m->have_logprob = 0; /* the logits are gradients now */
    backward_layers(m);
    m->grads_at = m->host ? ON_BOTH : ON_BACKEND;
    return 0;
}

float *al_model_backend_params(al_model *m)
{
    params_to_backend(m);
    return m->dmaster;
}
float *al_model_backend_grads(al_model *m)
{
    grads_to_backend(m);
    m->grads_at = m->host ? ON_BOTH : ON_BACKEND;
    return m->dgrads;
}
void al_model_backend_params_changed(al_model *m)
{
    if (m->host) return;
    m->be->ops->weights_from_master(m->be, m->dw, m->dmaster, m->nparams);
    m->params_at = ON_BACKEND;
}

double al_model_clip_grads(al_model *m, float max_norm)
{
    grads_to_backend(m);
    al_backend *b = m->be;
    double norm = sqrt(b->ops->sum_squares(b, m->dgrads, m->nparams));
    if (!(max_norm > 0.0f) || !isfinite(norm)) return norm;
    /* torch computes the coefficient in float32 and multiplies the gradients by it. */
    float coef = (float)max_norm / ((float)norm + 1e-6f);
    if (coef < 1.0f) {
        b->ops->scale(b, m->dgrads, m->nparams, coef);
        m->grads_at = m->host ? ON_BOTH : ON_BACKEND;
    }
    return norm;
}

void al_model_adamw_range(al_model *m, float *moment1, float *moment2, size_t off, size_t count,
                          const al_adamw_args *args)
{
    params_to_backend(m);
    grads_to_backend(m);
    m->be->ops->adamw_update(m->be, m->dmaster, m->host ? NULL : m->dw, m->dgrads, moment1,
                             moment2, off, count, args);
    m->params_at = m->host ? ON_BOTH : ON_BACKEND;
}

/* ---- serving: the same forward over rows against KV caches ---- */

struct al_infer_scratch {
    al_backend *be; /* the backend its buffers live on (set at first use) */
    size_t rows;    /* capacity in rows */
    void *mem;      /* acts for `rows` rows, backend memory */
    acts a;
    int32_t *tok_h, *pos_h, *last_h; /* host (rows) */
    int32_t *tok_d, *last_d;         /* backend (rows); == host ones on the CPU */
    int *cu_rows;                    /* host (rows + 1) */
    float *logits_d;                 /* device logits (rows with logits, V); NULL on the host */
    size_t logits_cap;               /* bytes */
};

al_infer_scratch *al_infer_scratch_new(void)
{
    return calloc(1, sizeof(al_infer_scratch));
}

static void scratch_release(al_infer_scratch *s)
{
    if (s->be) {
        s->be->ops->free(s->be, s->mem);
        if (!s->be->ops->host_memory) {
            s->be->ops->free(s->be, s->tok_d);
            s->be->ops->free(s->be, s->last_d);
            s->be->ops->free(s->be, s->logits_d);
        }
    }
    free(s->tok_h), free(s->pos_h), free(s->last_h), free(s->cu_rows);
    s->mem = NULL, s->tok_h = s->pos_h = s->last_h = s->tok_d = s->last_d = NULL;
    s->cu_rows = NULL, s->rows = 0, s->logits_d = NULL, s->logits_cap = 0;
}

void al_infer_scratch_free(al_infer_scratch *s)
{
    if (!s) return;
    scratch_release(s);
    free(s);
}

/* Grows s to R rows for model m (moving it to m's backend if it was elsewhere). 0 or -1. */
static int scratch_ensure(al_infer_scratch *s, const al_model *m, size_t R)
{
    if (s->be != m->be) {
        scratch_release(s);
        s->be = m->be;
    }
    if (R <= s->rows) return 0;
    size_t rows = s->rows ? s->rows : 16;
    while (rows < R)
        rows *= 2;
    al_backend *b = m->be;
    size_t sizes[NACTS];
    acts_sizes(m, rows, 0, sizes);
    size_t total = acts_total(sizes);
    void *mem = b->ops->alloc(b, total);
    int32_t *th = malloc(sizeof(int32_t) * rows), *ph = malloc(sizeof(int32_t) * rows);
    int32_t *lh = malloc(sizeof(int32_t) * rows), *td = th, *ld = lh;
    int *cu = malloc(sizeof(int) * (rows + 1));
    if (!b->ops->host_memory) {
        td = b->ops->alloc(b, sizeof(int32_t) * rows);
        ld = b->ops->alloc(b, sizeof(int32_t) * rows);
    }
    if (!mem || !th || !ph || !lh || !cu || !td || !ld) {
        b->ops->free(b, mem);
        if (!b->ops->host_memory) b->ops->free(b, td), b->ops->free(b, ld);
        free(th), free(ph), free(lh), free(cu);
        return -1;
    }
    scratch_release(s);
    s->be = b;
    s->mem = mem, s->tok_h = th, s->pos_h = ph, s->last_h = lh, s->tok_d = td, s->last_d = ld;
    s->cu_rows = cu, s->rows = rows;
    acts_carve(sizes, mem, &s->a);
    return 0;
}

/* Sequence i appends ntok[i] tokens to kvs[i]; logits of each sequence's last new row go to
 * row i of logits (n, V), or of every new row (sum of ntok, V) when all_rows. Inputs are
 * checked by the callers. */
static int forward_kv(const al_model *m, al_infer_scratch *s, al_kv *const *kvs,
                      const int32_t *const *tokens, const int *ntok, int n, int all_rows,
                      float *logits, char *errstr, size_t errlen)
{
    const al_model_config *c = &m->cfg;
    size_t R = 0;
    for (int i = 0; i < n; i++)
        R += (size_t)ntok[i];
    if (scratch_ensure(s, m, R > (size_t)n ? R : (size_t)n) != 0) {
        snprintf(errstr, errlen, "infer forward: out of memory for %zu rows", R);
        return -1;
    }
    /* the backend's weights must be current: a model is not changed while it serves */
    params_to_backend((al_model *)m);
    al_backend *b = m->be;
    const al_backend_ops *o = b->ops;
    int C = c->hidden_size, V = c->vocab_size, T = (int)R;
    s->cu_rows[0] = 0;
    for (int i = 0, r = 0; i < n; i++) {
        for (int t = 0; t < ntok[i]; t++, r++) {
            s->pos_h[r] = kvs[i]->len + t;
            s->tok_h[r] = tokens[i][t];
        }
        s->cu_rows[i + 1] = r;
        s->last_h[i] = r - 1;
    }
    if (!o->host_memory) o->upload(b, s->tok_d, s->tok_h, sizeof(int32_t) * R);
    fwd_in in = {.T = T, .tokens_d = s->tok_d, .nseq = n, .kvs = kvs, .cu_rows = s->cu_rows,
                 .positions_h = s->pos_h};
    forward_layers(m, &s->a, NULL, &in);
    for (int i = 0; i < n; i++)
        kvs[i]->len += ntok[i];
    /* the rows that need logits through the final norm and the LM head */
    const void *rows = s->a.res;
    int nrows = T;
    if (!all_rows) {
        if (!o->host_memory) o->upload(b, s->last_d, s->last_h, sizeof(int32_t) * (size_t)n);
        o->gather_rows(b, s->a.tmp, s->a.res, s->last_d, n, C);
        rows = s->a.tmp, nrows = n;
    }
    o->rmsnorm_forward(b, s->a.lnf, s->a.lnf_rstd, rows, WP(m, m->p.ln_f), nrows, C,
                       (float)c->rms_norm_eps);
    if (o->host_memory) {
        o->lm_head_forward(b, logits, s->a.lnf, WP(m, m->p.lm_head), nrows, C, V);
    } else {
        size_t need = sizeof(float) * (size_t)nrows * V;
        if (ensure_buf(b, (void **)&s->logits_d, &s->logits_cap, need)) {
            snprintf(errstr, errlen, "infer forward: out of %s memory for logits", o->name);
            return -1;
        }
        o->lm_head_forward(b, s->logits_d, s->a.lnf, WP(m, m->p.lm_head), nrows, C, V);
        o->download(b, logits, s->logits_d, need);
    }
    return 0;
}

size_t al_infer_kv_bytes(const al_model_config *c, int max_tokens)
{
    return 2 * sizeof(float) * (size_t)c->num_layers * (size_t)max_tokens *
           (size_t)c->num_kv_heads * (size_t)c->head_dim;
}

al_infer_kv *al_infer_kv_new(const al_model *m, int max_tokens, char *errstr, size_t errlen)
{
    const al_model_config *c = &m->cfg;
    if (max_tokens <= 0) {
        snprintf(errstr, errlen, "kv cache: max_tokens must be positive, got %d", max_tokens);
        return NULL;
    }
    al_kv *kv = calloc(1, sizeof *kv);
    if (!kv) goto oom;
    kv->be = m->be;
    kv->L = c->num_layers, kv->max = max_tokens, kv->kvw = c->num_kv_heads * c->head_dim;
    if (m->be->ops->kv_alloc(m->be, kv) != 0) {
        free(kv);
        goto oom;
    }
    return kv;
oom:
    snprintf(errstr, errlen, "kv cache: out of memory for %d tokens (%.1f MiB)", max_tokens,
             al_infer_kv_bytes(c, max_tokens) / 1048576.0);
    return NULL;
}

void al_infer_kv_free(al_infer_kv *kv)
{
    if (!kv) return;
    kv->be->ops->kv_free(kv->be, kv);
    free(kv);
}

int al_infer_kv_copy_prefix(al_infer_kv *dst, const al_infer_kv *src, int len)
{
    if (len < 0 || len > src->len || len > dst->max || dst->L != src->L || dst->kvw != src->kvw ||
        dst->be != src->be)
        return -1;
    src->be->ops->kv_copy_prefix(src->be, dst, src, len);
    dst->len = len;
    return 0;
}

int al_infer_forward(const al_model *m, al_infer_scratch *s, al_infer_kv *const *kvs,
                     const int32_t *const *tokens, const int *ntok, int n, float *logits,
                     char *errstr, size_t errlen)
{
    const al_model_config *c = &m->cfg;
    if (n <= 0) {
        snprintf(errstr, errlen, "infer forward: no sequences");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (ntok[i] <= 0 || ntok[i] > kvs[i]->max - kvs[i]->len) {
            snprintf(errstr, errlen,
                     "infer forward: sequence %d: %d more tokens do not fit its cache (%d of %d "
                     "used)",
                     i, ntok[i], kvs[i]->len, kvs[i]->max);
            return -1;
        }
        if (kvs[i]->be != m->be) {
            snprintf(errstr, errlen, "infer forward: sequence %d: its cache is on %s, the model on %s",
                     i, kvs[i]->be->ops->name, m->be->ops->name);
            return -1;
        }
        for (int t = 0; t < ntok[i]; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= c->vocab_size) {
                snprintf(errstr, errlen, "infer forward: token %d is outside the vocabulary (%d)",
                         tokens[i][t], c->vocab_size);
                return -1;
            }
    }
    return forward_kv(m, s, kvs, tokens, ntok, n, 0, logits, errstr, errlen);
}

/* ---- one sequence with its own cache (al_model_kv) ---- */

struct al_model_kv {
    al_kv *kv;
    al_infer_scratch *s;
};

al_model_kv *al_model_kv_new(const al_model *m, int max_tokens, char *errstr, size_t errlen)
{
    if (max_tokens <= 0) {
        if (errstr && errlen) snprintf(errstr, errlen, "kv cache: max_tokens must be positive");
        return NULL;
    }
    al_model_kv *kv = calloc(1, sizeof *kv);
    char err[256];
    if (kv) kv->kv = al_infer_kv_new(m, max_tokens, err, sizeof err);
    if (kv && kv->kv) kv->s = al_infer_scratch_new();
    if (!kv || !kv->kv || !kv->s) {
        if (errstr && errlen)
            snprintf(errstr, errlen, "%s", kv && !kv->kv ? err : "kv cache: out of memory");
        al_model_kv_free(kv);
        return NULL;
    }
    return kv;
}

void al_model_kv_free(al_model_kv *kv)
{
    if (!kv) return;
    al_infer_kv_free(kv->kv);
    al_infer_scratch_free(kv->s);
    free(kv);
}

void al_model_kv_reset(al_model_kv *kv)
{
    kv->kv->len = 0;
}
int al_model_kv_len(const al_model_kv *kv)
{
    return kv->kv->len;
}
void al_model_kv_truncate(al_model_kv *kv, int len)
{
    if (len >= 0 && len < kv->kv->len) kv->kv->len = len;
}

/* Long prompts go through in chunks of this many tokens, which bounds the scratch. */
#define KV_CHUNK 256

int al_model_kv_forward(al_model *m, al_model_kv *kv, const int32_t *tokens, int n, float *logits,
                        int last_only)
{
    const al_model_config *c = &m->cfg;
    m->err[0] = 0;
    if (n <= 0) return model_err(m, "kv forward: no tokens");
    if (n > kv->kv->max - kv->kv->len)
        return model_err(m, "kv forward: %d more tokens do not fit the cache (%d of %d used)", n,
                         kv->kv->len, kv->kv->max);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return model_err(m, "kv forward: token %d is outside the vocabulary (%d)", tokens[t],
                             c->vocab_size);
    for (int o = 0; o < n; o += KV_CHUNK) {
        int k = n - o < KV_CHUNK ? n - o : KV_CHUNK, last = o + k == n;
        const int32_t *tk = tokens + o;
        if (last_only && !last) {
            /* no logits wanted from this chunk: the cheapest head is the last row's */
            float *tmp = malloc(sizeof(float) * (size_t)c->vocab_size);
            if (!tmp) return model_err(m, "kv forward: out of memory");
            int rc = forward_kv(m, kv->s, &kv->kv, &tk, &k, 1, 0, tmp, m->err, sizeof m->err);
            free(tmp);
            if (rc) return -1;
            continue;
        }
        float *dst = last_only ? logits : logits + (size_t)o * c->vocab_size;
        if (forward_kv(m, kv->s, &kv->kv, &tk, &k, 1, !last_only, dst, m->err, sizeof m->err))
            return -1;
    }
    return 0;
}
