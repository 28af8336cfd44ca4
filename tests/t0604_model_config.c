/*
 * 0604: config.json. Real Hugging Face configs of the three families parse to the right
 * shapes; what arclight writes reads back the same; unknown architectures, inconsistent
 * sizes and unsupported features are errors naming the field.
 */
#include "testlib.h"

#include "model/config.h"

/* Qwen2.5-0.5B-Instruct's config.json, as published. */
static const char qwen25_05b[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"hidden_act\": \"silu\","
    " \"hidden_size\": 896, \"initializer_range\": 0.02, \"intermediate_size\": 4864,"
    " \"max_position_embeddings\": 32768, \"max_window_layers\": 21, \"model_type\": \"qwen2\","
    " \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.43.1\", \"use_cache\": true, \"use_sliding_window\": false,"
    " \"vocab_size\": 151936}";

/* Qwen3-0.6B's config.json, as published. */
static const char qwen3_06b[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
    " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 3072, \"max_position_embeddings\": 40960,"
    " \"max_window_layers\": 28, \"model_type\": \"qwen3\", \"num_attention_heads\": 16,"
    " \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

/* A Llama-2-style config (TinyLlama-1.1B's shape). */
static const char tinyllama[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"intermediate_size\": 5632,"
    " \"max_position_embeddings\": 2048, \"model_type\": \"llama\", \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 22, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": null, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"vocab_size\": 32000}";

static int parse(al_model_config *c, const char *s, char *err, size_t errlen)
{
    return al_model_config_parse(c, s, strlen(s), err, errlen);
}

TEST(published_configs_parse_to_their_shapes)
{
    char err[256];
    al_model_config c;
    REQUIREF(parse(&c, qwen25_05b, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(c.arch, AL_MODEL_ARCH_QWEN2);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.num_kv_heads, 2);
    CHECK(c.qkv_bias && !c.o_bias && !c.qk_norm && c.tie_word_embeddings);
    CHECK_EQ_INT(c.eos_token_id, 151645);
    CHECK_EQ_STR(c.torch_dtype, "bfloat16");
    /* Qwen2.5-0.5B has 494,032,768 parameters */
    CHECK_EQ_INT(al_model_config_num_params(&c), 494032768);

    REQUIREF(parse(&c, qwen3_06b, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(c.arch, AL_MODEL_ARCH_QWEN3);
    CHECK_EQ_INT(c.head_dim, 128); /* != 1024 / 16 */
    CHECK(!c.qkv_bias && c.qk_norm);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    /* Qwen3-0.6B: 596,049,920 parameters (tied) */
    CHECK_EQ_INT(al_model_config_num_params(&c), 596049920);

    REQUIREF(parse(&c, tinyllama, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(c.arch, AL_MODEL_ARCH_LLAMA);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK(!c.qkv_bias && !c.qk_norm && !c.tie_word_embeddings);
    CHECK_NEAR(c.rms_norm_eps, 1e-5, 0);
    /* TinyLlama-1.1B: 1,100,048,384 parameters */
    CHECK_EQ_INT(al_model_config_num_params(&c), 1100048384);
}

TEST(written_configs_read_back_the_same)
{
    const char *docs[] = {qwen25_05b, qwen3_06b, tinyllama};
    for (int i = 0; i < 3; i++) {
        char err[256];
        al_model_config a, b;
        REQUIRE(parse(&a, docs[i], err, sizeof err) == 0);
        char *text = al_model_config_to_json(&a, NULL);
        REQUIRE(text);
        REQUIREF(parse(&b, text, err, sizeof err) == 0, "%s\n%s", err, text);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        free(text);
    }
}

TEST(bad_configs_are_errors_naming_the_problem)
{
    static const struct {
        const char *json, *expect;
    } cases[] = {
        {"{\"architectures\":[\"MistralForCausalLM\"],\"vocab_size\":8}",
         "unsupported architecture \"MistralForCausalLM\""},
        {"{\"model_type\":\"gpt2\"}", "unsupported model_type"},
        {"{\"vocab_size\":8}", "neither"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"model_type\":\"llama\"}", "does not match"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,\"num_"
         "hidden_layers\":1,\"num_attention_heads\":2}",
         "\"intermediate_size\""},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_"
         "value_heads\":3}",
         "not a multiple"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":9,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
         "hidden_size (9) is not a multiple"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":-8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
         "\"vocab_size\" = -8"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8.5,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
         "not an integer"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_"
         "scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0}}",
         "rope_scaling \"llama3\""},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"use_sliding_"
         "window\":true}",
         "use_sliding_window"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"hidden_act\":"
         "\"gelu\"}",
         "hidden_act \"gelu\""},
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"eos_token_"
         "id\":9}",
         "eos token id"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"head_dim\":"
         "5}",
         "head_dim (5) must be even"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"head_dim\":"
         "8}",
         "hidden_size (8) is not num_attention_heads"},
        /* beyond the double range: reads as infinity, which is not a usable epsilon */
        {"{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":8,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rms_norm_"
         "eps\":1e506}",
         "positive finite numbers (got inf"},
        {"{\"architectures\":[\"LlamaForCausalLM\"],", "config.json:"},
        {"[1]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        al_model_config c;
        CHECKF(parse(&c, cases[i].json, err, sizeof err) == -1, "case %zu parsed", i);
        CHECKF(strstr(err, cases[i].expect) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, err,
               cases[i].expect);
    }
    char err[256];
    al_model_config c;
    CHECK(al_model_config_load(&c, "/nonexistent/config.json", err, sizeof err) == -1);
    CHECKF(strstr(err, "/nonexistent/config.json"), "%s", err);
}

TEST(shipped_tiny_configs_load)
{
    char err[256];
    al_model_config c;
    REQUIREF(al_model_config_load(&c, "tests/model/tiny-qwen2.json", err, sizeof err) == 0, "%s",
             err);
    CHECK(c.arch == AL_MODEL_ARCH_QWEN2 && c.tie_word_embeddings);
    REQUIREF(al_model_config_load(&c, "tests/model/tiny-qwen3.json", err, sizeof err) == 0, "%s",
             err);
    CHECK(c.arch == AL_MODEL_ARCH_QWEN3 && !c.tie_word_embeddings && c.head_dim == 32);
    /* ids of tests/tokenizer/tiny: <|endoftext|> 505, <|im_end|> 507 */
    CHECK_EQ_INT(c.bos_token_id, 505);
    CHECK_EQ_INT(c.eos_token_id, 507);
    REQUIREF(al_model_config_load(&c, "tests/model/ref-qwen3", err, sizeof err) == 0, "%s", err);
}
