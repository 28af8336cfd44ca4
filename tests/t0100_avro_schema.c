/*
 * t0100_avro_schema: Parsing Canonical Form and CRC-64-AVRO fingerprints against the
 * values the Avro project publishes, and the embedded schema registry.
 *
 * Expected canonical forms and fingerprints come from the Avro repository's
 * share/test/data/schema-tests.txt (apache/avro, cases 000-033; the file says the Java
 * implementation cross-checks every "fingerprint" value there). Fingerprints are written
 * there as signed 64-bit decimals; they are compared here the same way.
 */
#include "avro/codec.h"
#include "testlib.h"

#include <jansson.h>

typedef struct vector {
    const char *input;
    const char *canonical;
    int has_fp;
    int64_t fp;
} vector;

static const vector vectors[] = {
    {"\"null\"", "\"null\"", 1, 7195948357588979594LL},
    {"{\"type\":\"null\"}", "\"null\"", 0, 0},
    {"\"boolean\"", "\"boolean\"", 1, -6970731678124411036LL},
    {"{\"type\":\"boolean\"}", "\"boolean\"", 0, 0},
    {"\"int\"", "\"int\"", 1, 8247732601305521295LL},
    {"{\"type\":\"int\"}", "\"int\"", 0, 0},
    {"\"long\"", "\"long\"", 1, -3434872931120570953LL},
    {"{\"type\":\"long\"}", "\"long\"", 0, 0},
    {"\"float\"", "\"float\"", 1, 5583340709985441680LL},
    {"{\"type\":\"float\"}", "\"float\"", 0, 0},
    {"\"double\"", "\"double\"", 1, -8181574048448539266LL},
    {"{\"type\":\"double\"}", "\"double\"", 0, 0},
    {"\"bytes\"", "\"bytes\"", 1, 5746618253357095269LL},
    {"{\"type\":\"bytes\"}", "\"bytes\"", 0, 0},
    {"\"string\"", "\"string\"", 1, -8142146995180207161LL},
    {"{\"type\":\"string\"}", "\"string\"", 0, 0},
    {"[  ]", "[]", 1, -1241056759729112623LL},
    {"[ \"int\"  ]", "[\"int\"]", 1, -5232228896498058493LL},
    {"[ \"int\" , {\"type\":\"boolean\"} ]", "[\"int\",\"boolean\"]", 1, 5392556393470105090LL},
    {"{\"fields\":[], \"type\":\"record\", \"name\":\"foo\"}",
     "{\"name\":\"foo\",\"type\":\"record\",\"fields\":[]}", 1, -4824392279771201922LL},
    {"{\"fields\":[], \"type\":\"record\", \"name\":\"foo\", \"namespace\":\"x.y\"}",
     "{\"name\":\"x.y.foo\",\"type\":\"record\",\"fields\":[]}", 1, 5916914534497305771LL},
    {"{\"fields\":[], \"type\":\"record\", \"name\":\"a.b.foo\", \"namespace\":\"x.y\"}",
     "{\"name\":\"a.b.foo\",\"type\":\"record\",\"fields\":[]}", 1, -4616218487480524110LL},
    {"{\"fields\":[], \"type\":\"record\", \"name\":\"foo\", \"doc\":\"Useful info\"}",
     "{\"name\":\"foo\",\"type\":\"record\",\"fields\":[]}", 1, -4824392279771201922LL},
    {"{\"fields\":[], \"type\":\"record\", \"name\":\"foo\", \"aliases\":[\"foo\",\"bar\"]}",
     "{\"name\":\"foo\",\"type\":\"record\",\"fields\":[]}", 1, -4824392279771201922LL},
    {"{\"fields\":[], \"type\":\"record\", \"name\":\"foo\", \"doc\":\"foo\", \"aliases\":[\"foo\",\"bar\"]}",
     "{\"name\":\"foo\",\"type\":\"record\",\"fields\":[]}", 1, -4824392279771201922LL},
    {"{\"fields\":[{\"type\":{\"type\":\"boolean\"}, \"name\":\"f1\"}], \"type\":\"record\", \"name\":\"foo\"}",
     "{\"name\":\"foo\",\"type\":\"record\",\"fields\":[{\"name\":\"f1\",\"type\":\"boolean\"}]}", 1,
     7843277075252814651LL},
    {"{ \"fields\":[{\"type\":\"boolean\", \"aliases\":[], \"name\":\"f1\", \"default\":\"true\"},\n"
     "            {\"order\":\"descending\",\"name\":\"f2\",\"doc\":\"Hello\",\"type\":\"int\"}],\n"
     "  \"type\":\"record\", \"name\":\"foo\"\n}",
     "{\"name\":\"foo\",\"type\":\"record\",\"fields\":[{\"name\":\"f1\",\"type\":\"boolean\"},{\"name\":\"f2\",\"type\":\"int\"}]}",
     1, -4860222112080293046LL},
    {"{\"type\":\"enum\", \"name\":\"foo\", \"symbols\":[\"A1\"]}",
     "{\"name\":\"foo\",\"type\":\"enum\",\"symbols\":[\"A1\"]}", 1, -6342190197741309591LL},
    {"{\"namespace\":\"x.y.z\", \"type\":\"enum\", \"name\":\"foo\", \"doc\":\"foo bar\", \"symbols\":[\"A1\", \"A2\"]}",
     "{\"name\":\"x.y.z.foo\",\"type\":\"enum\",\"symbols\":[\"A1\",\"A2\"]}", 1, -4448647247586288245LL},
    {"{\"name\":\"foo\",\"type\":\"fixed\",\"size\":15}",
     "{\"name\":\"foo\",\"type\":\"fixed\",\"size\":15}", 1, 1756455273707447556LL},
    {"{\"namespace\":\"x.y.z\", \"type\":\"fixed\", \"name\":\"foo\", \"doc\":\"foo bar\", \"size\":32}",
     "{\"name\":\"x.y.z.foo\",\"type\":\"fixed\",\"size\":32}", 1, -3064184465700546786LL},
    {"{ \"items\":{\"type\":\"null\"}, \"type\":\"array\"}", "{\"type\":\"array\",\"items\":\"null\"}", 1,
     -589620603366471059LL},
    {"{ \"values\":\"string\", \"type\":\"map\"}", "{\"type\":\"map\",\"values\":\"string\"}", 1,
     -8732877298790414990LL},
    {"  {\"name\":\"PigValue\",\"type\":\"record\",\n"
     "   \"fields\":[{\"name\":\"value\", \"type\":[\"null\", \"int\", \"long\", \"PigValue\"]}]}",
     "{\"name\":\"PigValue\",\"type\":\"record\",\"fields\":[{\"name\":\"value\",\"type\":[\"null\",\"int\",\"long\",\"PigValue\"]}]}",
     1, -1759257747318642341LL},
};

TEST(canonical_form_matches_the_avro_test_vectors)
{
    char err[256];
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        char *c = al_avro_canonical_form(vectors[i].input, err, sizeof err);
        CHECKF(c != NULL, "case %03zu: %s", i, err);
        if (c) CHECKF(strcmp(c, vectors[i].canonical) == 0, "case %03zu: %s != %s", i, c, vectors[i].canonical);
        free(c);
    }
}

TEST(fingerprints_match_the_avro_test_vectors)
{
    char err[256];
    int checked = 0;
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        uint64_t fp;
        REQUIREF(al_avro_fingerprint(vectors[i].input, &fp, err, sizeof err) == 0, "case %03zu: %s", i, err);
        uint64_t direct = al_avro_crc64(vectors[i].canonical, strlen(vectors[i].canonical));
        CHECKF(fp == direct, "case %03zu: fingerprint of input != fingerprint of canonical", i);
        if (!vectors[i].has_fp) continue;
        checked++;
        CHECKF((int64_t)fp == vectors[i].fp, "case %03zu: %lld != %lld", i, (long long)(int64_t)fp,
               (long long)vectors[i].fp);
    }
    CHECK(checked >= 25);
}

TEST(crc64_of_nothing_is_the_empty_constant)
{
    CHECK(al_avro_crc64("", 0) == 0xc15d213aa4d7a795ULL);
}

TEST(canonical_form_uses_full_names_for_nested_and_referenced_types)
{
    const char *in = "{\"type\":\"record\",\"name\":\"Outer\",\"namespace\":\"a.b\",\"doc\":\"x\","
                     "\"fields\":[{\"name\":\"in\",\"type\":{\"type\":\"record\",\"name\":\"Inner\","
                     "\"fields\":[{\"name\":\"e\",\"type\":{\"type\":\"enum\",\"name\":\"c.E\",\"symbols\":[\"X\"]}}]}},"
                     "{\"name\":\"again\",\"type\":\"Inner\",\"default\":{}},"
                     "{\"name\":\"e2\",\"type\":\"c.E\"}]}";
    char err[256];
    char *c = al_avro_canonical_form(in, err, sizeof err);
    REQUIREF(c, "%s", err);
    CHECK_EQ_STR(c, "{\"name\":\"a.b.Outer\",\"type\":\"record\",\"fields\":["
                    "{\"name\":\"in\",\"type\":{\"name\":\"a.b.Inner\",\"type\":\"record\",\"fields\":["
                    "{\"name\":\"e\",\"type\":{\"name\":\"c.E\",\"type\":\"enum\",\"symbols\":[\"X\"]}}]}},"
                    "{\"name\":\"again\",\"type\":\"a.b.Inner\"},{\"name\":\"e2\",\"type\":\"c.E\"}]}");
    free(c);
}

TEST(bad_schemas_are_refused_with_a_reason)
{
    char err[256];
    struct {
        const char *json, *expect;
    } bad[] = {
        {"{", "not valid JSON"},
        {"\"nosuch\"", "unknown type"},
        {"{\"type\":\"record\",\"fields\":[]}", "needs a \"name\""},
        {"{\"type\":\"record\",\"name\":\"r\"}", "\"fields\""},
        {"{\"type\":\"enum\",\"name\":\"e\",\"symbols\":[\"A\",\"A\"]}", "twice"},
        {"[[\"int\"]]", "union"},
        {"{\"type\":\"fixed\",\"name\":\"f\"}", "size"},
        {"42", "must be"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        char *c = al_avro_canonical_form(bad[i].json, err, sizeof err);
        CHECKF(c == NULL, "%s was accepted", bad[i].json);
        free(c);
        CHECKF(strstr(err, bad[i].expect), "%s: error \"%s\" lacks \"%s\"", bad[i].json, err, bad[i].expect);
    }
}

TEST(registry_knows_every_schema_by_name_and_fingerprint)
{
    const char *names[] = {"Span", "Transition", "BatchChunk", "PolicyVersion", "DeadLetter"};
    for (size_t i = 0; i < 5; i++) {
        const al_schema_info *in = al_schema_by_name(names[i]);
        REQUIREF(in, "%s not registered", names[i]);
        char full[64];
        snprintf(full, sizeof full, "ai.arclight.%s", names[i]);
        CHECK_EQ_STR(in->name, full);
        CHECK(al_schema_by_name(full) == in);
        CHECK(al_schema_by_fingerprint(in->fingerprint) == in);
        CHECK(in->current);
        /* the fingerprint is of the canonical form of the embedded text */
        uint64_t fp;
        char err[256];
        REQUIREF(al_avro_fingerprint(in->json, &fp, err, sizeof err) == 0, "%s", err);
        CHECK(fp == in->fingerprint);
        /* every field is documented */
        json_t *j = json_loads(in->json, 0, NULL);
        REQUIRE(j);
        CHECK(json_is_string(json_object_get(j, "doc")));
        json_decref(j);
        CHECK(strstr(in->canonical, "\"doc\"") == NULL);
    }
    CHECK(al_schema_by_name("Nope") == NULL);
    CHECK(al_schema_by_fingerprint(12345) == NULL);
}

/* Every record field in every schema, nested ones included, has a "doc". */
static int count_undocumented(json_t *t)
{
    int n = 0;
    if (json_is_array(t)) {
        for (size_t i = 0; i < json_array_size(t); i++) n += count_undocumented(json_array_get(t, i));
    } else if (json_is_object(t)) {
        json_t *fields = json_object_get(t, "fields");
        for (size_t i = 0; i < json_array_size(fields); i++) {
            json_t *f = json_array_get(fields, i);
            if (!json_is_string(json_object_get(f, "doc"))) {
                fprintf(stderr, "  undocumented field %s\n", json_string_value(json_object_get(f, "name")));
                n++;
            }
            n += count_undocumented(json_object_get(f, "type"));
        }
        n += count_undocumented(json_object_get(t, "items"));
        n += count_undocumented(json_object_get(t, "values"));
    }
    return n;
}

TEST(every_field_has_a_doc)
{
    const char *names[] = {"Span", "Transition", "BatchChunk", "PolicyVersion", "DeadLetter"};
    for (size_t i = 0; i < 5; i++) {
        const al_schema_info *in = al_schema_by_name(names[i]);
        REQUIRE(in);
        json_t *j = json_loads(in->json, 0, NULL);
        REQUIRE(j);
        CHECKF(count_undocumented(j) == 0, "%s has undocumented fields", names[i]);
        json_decref(j);
    }
}

TEST(registering_a_foreign_schema_is_refused)
{
    char err[256];
    CHECK(al_schema_register("{\"type\":\"record\",\"name\":\"x.Y\",\"fields\":[]}", err, sizeof err) == -1);
    CHECK(strstr(err, "not one of arclight's schemas"));
}
