/*
 * test_server_api.c — the protocol layer of the server (src/server/api*.c, metrics.c) without an
 * engine or a socket: request fields, defaults and every kind of 400, ChatML framing, vLLM's
 * context-length rules and messages, response and SSE shapes from synthetic engine events, logprob
 * formats, and the Prometheus text.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cvllm.h"
#include "server/api.h"
#include "server/metrics.h"

static cvllm_tokenizer *tok;

/* The test checkpoint's vocabulary is 4096; chat needs the full Qwen3 one for its special tokens. */
enum { SMALL_VOCAB = 4096, QWEN3_VOCAB = 151936 };

static cv_api_limits limits(int32_t max_model_len, int32_t vocab) {
    cv_api_limits l = {.max_model_len = max_model_len, .vocab_size = vocab, .max_n = 8, .max_prompts = 4, .gen_max_tokens = -1};
    cvllm_sampling_params_default(NULL, &l.defaults);
    l.defaults.temperature = 0.6f; /* as a generation_config would set it */
    return l;
}

/* Parses `body` as `kind`; expects failure with `status`, `param` ("" = null) and a message
 * containing `needle`. */
static void expect_error(cv_api_kind kind, const char *body, int status, const char *param, const char *needle) {
    cv_api_limits l = limits(64, SMALL_VOCAB);
    cv_api_request req;
    cv_api_error err = {0};
    int rc = kind == CV_API_CHAT ? cv_api_parse_chat(body, strlen(body), &l, &req, &err)
                                 : cv_api_parse_completion(body, strlen(body), &l, &req, &err);
    if (rc == 0) rc = cv_api_prepare(&req, tok, &l, &err);
    CHECK_MSG(rc != 0, "accepted: %s", body);
    if (rc) {
        CHECK_EQ_INT(err.status, status);
        CHECK_STR_EQ(err.param, param);
        CHECK_CONTAINS(err.message, needle);
    }
    cv_api_request_free(&req);
}

static void parse_ok(cv_api_kind kind, const char *body, cv_api_request *req, int32_t max_model_len) {
    cv_api_limits l = limits(max_model_len, kind == CV_API_CHAT ? QWEN3_VOCAB : SMALL_VOCAB);
    cv_api_error err = {0};
    int rc = kind == CV_API_CHAT ? cv_api_parse_chat(body, strlen(body), &l, req, &err)
                                 : cv_api_parse_completion(body, strlen(body), &l, req, &err);
    if (rc == 0) rc = cv_api_prepare(req, tok, &l, &err);
    CHECK_MSG(rc == 0, "%s: %s", body, err.message);
}

static void test_error_json(void) {
    cv_api_error err;
    CHECK_EQ_INT(cv_api_fail(&err, 404, "model", "The model `%s` does not exist.", "x"), -1);
    char *s = cv_api_error_json(&err);
    CHECK_STR_EQ(s, "{\"error\":{\"message\":\"The model `x` does not exist.\",\"type\":\"NotFoundError\",\"param\":\"model\",\"code\":404}}");
    free(s);
    /* A message cut inside a multi-byte character is trimmed back to valid UTF-8. */
    char big[1100];
    memset(big, 'a', sizeof big);
    memcpy(big + 1021, "\xC3\xA9\xC3\xA9", 4);
    big[1099] = '\0';
    cv_api_fail(&err, 400, NULL, "%s", big);
    s = cv_api_error_json(&err);
    CHECK(s != NULL);
    CHECK_CONTAINS(s, "\"param\":null");
    free(s);
}

static void test_completion_fields(void) {
    cv_api_request r;
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"I am in the house\"}", &r, 64);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_EQ_INT(r.prompts[0].n_ids, 5);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 16);
    CHECK(fabsf(r.params.temperature - 0.6f) < 1e-6f); /* server default when the request is silent */
    CHECK_EQ_INT(r.params.n, 1);
    CHECK_EQ_INT(r.top_logprobs, -1);
    CHECK(!r.stream && r.model == NULL);
    cv_api_request_free(&r);

    parse_ok(CV_API_COMPLETION,
             "{\"model\":\"m\",\"prompt\":[\"I am\",\"in the house\"],\"max_tokens\":null,\"n\":2.0,\"temperature\":0,"
             "\"top_k\":5,\"min_p\":0.1,\"repetition_penalty\":1.2,\"seed\":-7,\"stop\":\"house\",\"stop_token_ids\":[3,4],"
             "\"ignore_eos\":true,\"min_tokens\":2,\"skip_special_tokens\":false,\"include_stop_str_in_output\":true,"
             "\"logit_bias\":{\"12\":250,\"13\":-1.5},\"logprobs\":2,\"echo\":true,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},\"unknown_field\":{\"x\":1}}",
             &r, 64);
    CHECK_STR_EQ(r.model, "m");
    CHECK_EQ_INT(r.n_prompts, 2);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 16);
    CHECK_EQ_INT(r.params.n, 2);
    CHECK(r.params.temperature == 0);
    CHECK_EQ_INT(r.params.top_k, 5);
    CHECK(r.params.has_seed && r.params.seed == -7);
    CHECK_EQ_INT(r.params.n_stop, 1);
    CHECK_STR_EQ(r.params.stop[0], "house");
    CHECK_EQ_INT(r.params.n_stop_token_ids, 2);
    CHECK_EQ_INT(r.params.stop_token_ids[1], 4);
    CHECK(r.params.ignore_eos && !r.params.skip_special_tokens && r.params.include_stop_str_in_output);
    CHECK_EQ_INT(r.params.min_tokens, 2);
    CHECK_EQ_INT(r.params.n_logit_bias, 2);
    CHECK(r.params.logit_bias_values[0] == 100.0f); /* clamped to OpenAI's range */
    CHECK_EQ_INT(r.top_logprobs, 2);
    CHECK_EQ_INT(r.params.logprobs, 2);
    CHECK_EQ_INT(r.prompt_logprobs, 2); /* echo with logprobs also returns the prompt's */
    CHECK(r.stream && r.include_usage && r.echo);
    cvllm_sampling_params p = cv_api_prompt_params(&r, 1);
    CHECK_EQ_INT(p.max_tokens, 16);
    CHECK_EQ_INT(p.prompt_logprobs, 2);
    cv_api_request_free(&r);

    parse_ok(CV_API_COMPLETION, "{\"prompt\":[[1,2,3],[4]],\"max_tokens\":3}", &r, 64);
    CHECK_EQ_INT(r.n_prompts, 2);
    CHECK_EQ_INT(r.prompts[0].n_ids, 3);
    CHECK_EQ_INT(r.prompts[1].ids[0], 4);
    cv_api_request_free(&r);

    parse_ok(CV_API_COMPLETION, "{\"prompt\":[7,8],\"max_tokens\":0,\"echo\":true}", &r, 64);
    CHECK(r.echo_only);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 1); /* one token is generated and dropped, as vLLM does */
    cv_api_request_free(&r);
}

static void test_completion_errors(void) {
    const cv_api_kind C = CV_API_COMPLETION;
    expect_error(C, "{\"prompt\": ", 400, "", "JSON decode error");
    expect_error(C, "[1,2]", 400, "", "JSON object");
    expect_error(C, "{\"prompt\":\"a\xff\"}", 400, "", "JSON decode error");
    expect_error(C, "{\"prompt\":\"a\",\"prompt\":NaN}", 400, "", "JSON decode error");
    expect_error(C, "{}", 400, "prompt", "required");
    expect_error(C, "{\"prompt\":5}", 400, "prompt", "must be a string");
    expect_error(C, "{\"prompt\":[]}", 400, "prompt", "empty");
    expect_error(C, "{\"prompt\":[\"a\",[1]]}", 400, "prompt", "got an array");
    expect_error(C, "{\"prompt\":[1,\"a\"]}", 400, "prompt", "list of integers");
    expect_error(C, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "prompt", "at most 4");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":\"10\"}", 400, "max_tokens", "must be an integer, got a string");
    expect_error(C, "{\"prompt\":\"a\",\"n\":2.5}", 400, "n", "must be an integer");
    expect_error(C, "{\"prompt\":\"a\",\"n\":0}", 400, "n", "at least 1");
    expect_error(C, "{\"prompt\":\"a\",\"n\":9}", 400, "n", "at most 8");
    expect_error(C, "{\"prompt\":\"a\",\"n\":4294967297}", 400, "n", "out of range");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":1e300}", 400, "max_tokens", "must be an integer");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":123456789012345678901234567890}", 400, "", "JSON decode error");
    expect_error(C, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "temperature", "must be a number");
    expect_error(C, "{\"prompt\":\"a\",\"stream\":1}", 400, "stream", "must be a boolean");
    expect_error(C, "{\"prompt\":\"a\",\"stop\":5}", 400, "stop", "a string or a list");
    expect_error(C, "{\"prompt\":\"a\",\"stop\":[\"x\",3]}", 400, "stop", "a string or a list");
    expect_error(C, "{\"prompt\":\"a\",\"stop_token_ids\":\"1\"}", 400, "stop_token_ids", "list of integers");
    expect_error(C, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias", "token_id must be an integer");
    expect_error(C, "{\"prompt\":\"a\",\"logit_bias\":{\"1\":\"x\"}}", 400, "logit_bias", "numbers");
    expect_error(C, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options", "stream=True");
    expect_error(C, "{\"prompt\":\"a\",\"stream\":true,\"prompt_logprobs\":1}", 400, "prompt_logprobs", "stream=True");
    expect_error(C, "{\"prompt\":\"a\",\"logprobs\":-3}", 400, "logprobs", "non-negative");
    expect_error(C, "{\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix", "not currently supported");
    expect_error(C, "{\"prompt\":\"a\",\"use_beam_search\":true}", 400, "use_beam_search", "beam search");
    expect_error(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"}}", 400, "response_format", "json_object");
    expect_error(C, "{\"prompt\":\"a\",\"request_id\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}", 400,
                 "request_id", "longer");
    /* Context-length rules and their vLLM wording. */
    expect_error(C, "{\"prompt\":\"I am in the house\",\"max_tokens\":60}", 400, "max_tokens",
                 "'max_tokens' or 'max_completion_tokens' is too large: 60. This model's maximum context length is 64 "
                 "tokens and your request has 5 input tokens (60 > 64 - 5).");
    expect_error(C, "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,"
                    "33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64]}",
                 400, "prompt", "This model's maximum context length is 64 tokens. However, your request has 64 input tokens.");
    expect_error(C, "{\"prompt\":[1,4096]}", 400, "prompt", "Token id 4096 is out of vocabulary");
    expect_error(C, "{\"prompt\":[1,-2]}", 400, "prompt", "Token id -2 is out of vocabulary");
    expect_error(C, "{\"prompt\":[[1],[99999999999]]}", 400, "prompt", "out of vocabulary");
    expect_error(C, "{\"prompt\":\"\"}", 400, "prompt", "cannot be empty");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", "at least 1, got 0");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":-5}", 400, "max_tokens", "at least 1, got -5");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":-1}", 400, "max_tokens", "at least 1, got -1");
    expect_error(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}", 400, "max_tokens",
                 "at least 1, got -1");
    /* A text prompt whose tokens are outside the (small) model vocabulary. */
    expect_error(C, "{\"prompt\":\"<|im_start|>\"}", 400, "prompt", "Token id 151644 is out of vocabulary");
}

static void test_chatml(void) {
    cv_api_request r;
    parse_ok(CV_API_CHAT,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":\"text\",\"text\":\"there\"}]}]}",
             &r, 4096);
    CHECK_STR_EQ(r.prompts[0].text,
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n");
    /* No max_tokens: the rest of the context. */
    CHECK_EQ_INT(r.prompts[0].max_tokens, 4096 - (int32_t)r.prompts[0].n_ids);
    CHECK_EQ_INT(r.top_logprobs, -1);
    cv_api_request_free(&r);

    parse_ok(CV_API_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hel\"}],"
             "\"add_generation_prompt\":false,\"continue_final_message\":true,\"echo\":true,\"logprobs\":true,"
             "\"top_logprobs\":3,\"max_tokens\":9,\"max_completion_tokens\":7}",
             &r, 4096);
    CHECK_STR_EQ(r.prompts[0].text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel");
    CHECK_STR_EQ(r.echo_text, "Hel");
    CHECK_EQ_INT(r.top_logprobs, 3);
    CHECK_EQ_INT(r.params.logprobs, 3);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 7); /* max_completion_tokens wins */
    cv_api_request_free(&r);

    parse_ok(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null}],\"logprobs\":true}", &r, 4096);
    CHECK_STR_EQ(r.prompts[0].text, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    CHECK_EQ_INT(r.top_logprobs, 0); /* logprobs without top_logprobs: the sampled token only */
    cv_api_request_free(&r);

    /* generation_config's max_new_tokens caps the default. */
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.gen_max_tokens = 10;
    cv_api_error err;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    CHECK(cv_api_parse_chat(body, strlen(body), &l, &r, &err) == 0 && cv_api_prepare(&r, tok, &l, &err) == 0);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 10);
    cv_api_request_free(&r);

    const cv_api_kind H = CV_API_CHAT;
    expect_error(H, "{}", 400, "messages", "required");
    expect_error(H, "{\"messages\":\"hi\"}", 400, "messages", "must be a list of messages");
    expect_error(H, "{\"messages\":[]}", 400, "messages", "must not be empty");
    expect_error(H, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages", "messages[0] must be an object with a non-empty string 'role'");
    expect_error(H, "{\"messages\":[3]}", 400, "messages", "messages[0]");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages", "content must be a string");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400,
                 "messages", "'image_url' is not supported");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400, "messages", "text must be a string");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true}", 400,
                 "continue_final_message", "Cannot set both");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "top_logprobs",
                 "`logprobs` must be set to true");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":\"yes\"}", 400, "logprobs", "boolean");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":[1]}", 400,
                 "max_completion_tokens", "integer");
}

static void test_tokenize_parse(void) {
    cv_api_request r;
    cv_api_error err;
    const char *b = "{\"prompt\":\"hi\",\"return_token_strs\":true}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &r, &err) == 0);
    CHECK(r.return_token_strs && r.add_special_tokens);
    CHECK_STR_EQ(r.prompts[0].text, "hi");
    cv_api_request_free(&r);
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":false}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &r, &err) == 0);
    CHECK_STR_EQ(r.prompts[0].text, "<|im_start|>user\nhi<|im_end|>\n");
    cv_api_request_free(&r);
    b = "{\"prompt\":3}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &r, &err) != 0 && err.status == 400);
    cv_api_request_free(&r);
    b = "{\"tokens\":[40,1079]}";
    CHECK(cv_api_parse_detokenize(b, strlen(b), &r, &err) == 0);
    CHECK_EQ_INT(r.prompts[0].n_ids, 2);
    cv_api_request_free(&r);
    b = "{\"tokens\":[\"a\"]}";
    CHECK(cv_api_parse_detokenize(b, strlen(b), &r, &err) != 0 && !strcmp(err.param, "tokens"));
    cv_api_request_free(&r);
    b = "{}";
    CHECK(cv_api_parse_detokenize(b, strlen(b), &r, &err) != 0 && strstr(err.message, "required"));
    cv_api_request_free(&r);
}

/* ------------------------------------------------------------------------------------------------ */
/* Responses from synthetic events                                                                   */

/* One delta with `n` tokens from `ids`, text `text`, finish `f`; logprobs when `lps` is given. */
static cv_completion_delta delta(int32_t index, int32_t *ids, size_t n, const char *text, cvllm_finish_reason f,
                                 cvllm_position_logprobs *lps) {
    return (cv_completion_delta){.index = index, .token_ids = ids, .n_token_ids = n, .text = (char *)text,
                                 .text_len = strlen(text), .logprobs = lps, .finish_reason = f, .stop_token_id = -1};
}

static json_t *parse_json(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    CHECK_MSG(j != NULL, "%s: %s", e.text, s);
    return j;
}

static void test_completion_response(void) {
    cv_api_request r;
    parse_ok(CV_API_COMPLETION, "{\"prompt\":[\"I am\",\"in the house\"],\"n\":2,\"max_tokens\":2,\"stop\":\"x\"}", &r, 64);
    cv_api_response resp;
    cv_api_response_init(&resp, &r, tok, "qwen3", true);
    CHECK(!strncmp(resp.id, "cmpl-", 5) && strlen(resp.id) == 5 + 32);
    int32_t a[] = {279, 3753}, b[] = {13};
    cv_completion_delta d0[] = {delta(0, a, 1, " the", CVLLM_FINISH_NONE, NULL), delta(1, b, 1, ".", CVLLM_FINISH_NONE, NULL)};
    cv_request_event ev = {.outputs = d0, .n_outputs = 2, .n_prompt_token_ids = 2, .n_cached_tokens = 1};
    cv_api_response_apply(&resp, 0, &ev, NULL, NULL, NULL);
    cv_completion_delta d1[] = {delta(0, a + 1, 1, " house", CVLLM_FINISH_LENGTH, NULL), delta(1, b, 0, "", CVLLM_FINISH_STOP, NULL)};
    d1[1].stop_str = "x";
    ev = (cv_request_event){.outputs = d1, .n_outputs = 2, .n_prompt_token_ids = 2, .n_cached_tokens = 1, .finished = true};
    cv_api_response_apply(&resp, 0, &ev, NULL, NULL, NULL);
    CHECK(!cv_api_response_done(&resp));
    cv_completion_delta d2[] = {delta(1, a, 2, " the house", CVLLM_FINISH_LENGTH, NULL)};
    d2[0].finish_reason = CVLLM_FINISH_NONE;
    cv_completion_delta d3[] = {delta(0, b, 1, ".", CVLLM_FINISH_STOP, NULL)};
    d3[0].stop_token_id = 13;
    ev = (cv_request_event){.outputs = d2, .n_outputs = 1, .n_prompt_token_ids = 3};
    cv_api_response_apply(&resp, 1, &ev, NULL, NULL, NULL);
    ev = (cv_request_event){.outputs = d3, .n_outputs = 1, .n_prompt_token_ids = 3, .finished = true};
    cv_api_response_apply(&resp, 1, &ev, NULL, NULL, NULL);
    CHECK(cv_api_response_done(&resp));
    char *s = cv_api_response_json(&resp);
    json_t *j = parse_json(s);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "object")), "text_completion");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "model")), "qwen3");
    CHECK(json_is_null(json_object_get(j, "system_fingerprint")));
    json_t *ch = json_object_get(j, "choices");
    CHECK_EQ_INT(json_array_size(ch), 4);
    static const char *texts[] = {" the house", ".", ".", " the house"};
    static const char *finish[] = {"length", "stop", "stop", NULL};
    for (size_t i = 0; i < 4 && i < json_array_size(ch); i++) {
        json_t *c = json_array_get(ch, i);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "index")), i);
        CHECK_STR_EQ(json_string_value(json_object_get(c, "text")), texts[i]);
        if (finish[i]) CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), finish[i]);
        else CHECK(json_is_null(json_object_get(c, "finish_reason")));
    }
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(ch, 1), "stop_reason")), "x");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(ch, 2), "stop_reason")), 13);
    CHECK(json_is_null(json_object_get(json_array_get(ch, 0), "stop_reason")));
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 6);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), 11);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 1);
    json_decref(j);
    free(s);
    cv_api_response_free(&resp);
    cv_api_request_free(&r);
}

static void test_completion_logprobs_and_echo(void) {
    cv_api_request r;
    parse_ok(CV_API_COMPLETION, "{\"prompt\":[40,1079],\"max_tokens\":2,\"logprobs\":1,\"echo\":true}", &r, 64);
    cv_api_response resp;
    cv_api_response_init(&resp, &r, tok, "m", false);
    cvllm_logprob top_p[] = {{1079, -0.5f, 1}};
    cvllm_position_logprobs plp[] = {{.chosen = {40, 0, 0}}, {.chosen = {1079, -0.5f, 1}, .top = top_p, .n_top = 1}};
    cvllm_logprob top[] = {{304, -0.1f, 1}, {279, -2.0f, 2}};
    cvllm_position_logprobs lp[] = {{.chosen = {304, -0.1f, 1}, .top = top, .n_top = 2},
                                    {.chosen = {279, -INFINITY, 9}, .top = top, .n_top = 2}};
    int32_t ids[] = {304, 279};
    cv_completion_delta d[] = {delta(0, ids, 2, " in the", CVLLM_FINISH_LENGTH, lp)};
    cv_request_event ev = {.outputs = d, .n_outputs = 1, .n_prompt_token_ids = 2, .prompt_logprobs = plp, .finished = true};
    char *sse = NULL;
    size_t len = 0, cap = 0;
    cv_api_response_apply(&resp, 0, &ev, &sse, &len, &cap);
    free(sse);
    char *s = cv_api_response_json(&resp);
    json_t *j = parse_json(s);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(c, "text")), "I am in the");
    json_t *l = json_object_get(c, "logprobs");
    json_t *tokens = json_object_get(l, "tokens"), *tlp = json_object_get(l, "token_logprobs");
    json_t *offs = json_object_get(l, "text_offset"), *tops = json_object_get(l, "top_logprobs");
    CHECK_EQ_INT(json_array_size(tokens), 4);
    CHECK_STR_EQ(json_string_value(json_array_get(tokens, 0)), "I");
    CHECK_STR_EQ(json_string_value(json_array_get(tokens, 2)), " in");
    CHECK(json_is_null(json_array_get(tlp, 0)) && json_is_null(json_array_get(tops, 0)));
    CHECK(fabs(json_real_value(json_array_get(tlp, 1)) + 0.5) < 1e-6);
    CHECK(json_real_value(json_array_get(tlp, 3)) == -9999.0); /* -inf as OpenAI prints it */
    CHECK_EQ_INT(json_integer_value(json_array_get(offs, 0)), 0);
    CHECK_EQ_INT(json_integer_value(json_array_get(offs, 1)), 1);
    CHECK_EQ_INT(json_integer_value(json_array_get(offs, 2)), 4);
    CHECK_EQ_INT(json_integer_value(json_array_get(offs, 3)), 7);
    /* top_logprobs holds the chosen token plus the top `logprobs` entries. */
    json_t *t3 = json_array_get(tops, 3);
    CHECK_EQ_INT(json_object_size(t3), 2);
    CHECK(json_object_get(t3, " the") && json_object_get(t3, " in"));
    json_t *pl = json_object_get(c, "prompt_logprobs");
    CHECK(json_is_null(json_array_get(pl, 0)));
    json_t *p1 = json_object_get(json_array_get(pl, 1), "1079");
    CHECK_EQ_INT(json_integer_value(json_object_get(p1, "rank")), 1);
    CHECK_STR_EQ(json_string_value(json_object_get(p1, "decoded_token")), " am");
    json_decref(j);
    free(s);
    cv_api_response_free(&resp);
    cv_api_request_free(&r);
}

/* Splits an SSE buffer into its data payloads. */
static size_t sse_events(const char *sse, char out[][2048], size_t max) {
    size_t n = 0;
    for (const char *p = sse; p && *p && n < max;) {
        CHECK(!strncmp(p, "data: ", 6));
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        size_t k = (size_t)(end - p - 6) < 2047 ? (size_t)(end - p - 6) : 2047;
        memcpy(out[n], p + 6, k);
        out[n++][k] = '\0';
        p = end + 2;
    }
    return n;
}

static void test_chat_stream(void) {
    cv_api_request r;
    parse_ok(CV_API_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
             "\"logprobs\":true,\"top_logprobs\":1,\"request_id\":\"abc\"}",
             &r, 4096);
    cv_api_response resp;
    cv_api_response_init(&resp, &r, tok, "qwen3", false);
    CHECK_STR_EQ(resp.id, "chatcmpl-abc");
    char *sse = NULL;
    size_t len = 0, cap = 0;
    int32_t ids[] = {13, 40};
    cvllm_logprob top[] = {{13, -0.25f, 1}};
    cvllm_position_logprobs lp[] = {{.chosen = {13, -0.25f, 1}, .top = top, .n_top = 1},
                                    {.chosen = {40, -3.0f, 4}, .top = top, .n_top = 1}};
    cv_completion_delta d0[] = {delta(0, ids, 1, ".", CVLLM_FINISH_NONE, lp)};
    cv_request_event ev = {.outputs = d0, .n_outputs = 1, .n_prompt_token_ids = 9};
    cv_api_response_apply(&resp, 0, &ev, &sse, &len, &cap);
    cv_completion_delta d1[] = {delta(0, ids + 1, 1, "I", CVLLM_FINISH_STOP, lp + 1)};
    d1[0].stop_token_id = 40;
    ev = (cv_request_event){.outputs = d1, .n_outputs = 1, .n_prompt_token_ids = 9, .finished = true};
    cv_api_response_apply(&resp, 0, &ev, &sse, &len, &cap);
    cv_api_response_stream_end(&resp, &sse, &len, &cap);
    char ev_text[8][2048];
    size_t n = sse_events(sse, ev_text, 8);
    CHECK_EQ_INT(n, 5);
    json_t *role = parse_json(ev_text[0]);
    json_t *c0 = json_array_get(json_object_get(role, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(role, "object")), "chat.completion.chunk");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(c0, "delta"), "role")), "assistant");
    json_decref(role);
    json_t *mid = parse_json(ev_text[1]);
    json_t *c1 = json_array_get(json_object_get(mid, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(c1, "delta"), "content")), ".");
    CHECK(json_is_null(json_object_get(c1, "finish_reason")));
    json_t *content = json_object_get(json_object_get(c1, "logprobs"), "content");
    json_t *e0 = json_array_get(content, 0);
    CHECK_STR_EQ(json_string_value(json_object_get(e0, "token")), ".");
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(e0, "bytes"), 0)), '.');
    CHECK_EQ_INT(json_array_size(json_object_get(e0, "top_logprobs")), 1);
    json_decref(mid);
    json_t *last = parse_json(ev_text[2]);
    json_t *c2 = json_array_get(json_object_get(last, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(c2, "finish_reason")), "stop");
    CHECK_EQ_INT(json_integer_value(json_object_get(c2, "stop_reason")), 40);
    json_decref(last);
    json_t *usage = parse_json(ev_text[3]);
    CHECK_EQ_INT(json_array_size(json_object_get(usage, "choices")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(usage, "usage"), "completion_tokens")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(usage, "usage"), "prompt_tokens")), 9);
    json_decref(usage);
    CHECK_STR_EQ(ev_text[4], "[DONE]");
    free(sse);
    /* The non-streaming view of the same events. */
    char *s = cv_api_response_json(&resp);
    json_t *j = parse_json(s);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    CHECK_STR_EQ(json_string_value(json_object_get(msg, "content")), ".I");
    CHECK_STR_EQ(json_string_value(json_object_get(msg, "role")), "assistant");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_decref(j);
    free(s);
    cv_api_response_free(&resp);
    cv_api_request_free(&r);

    cv_api_error err;
    cv_api_fail(&err, 500, NULL, "boom");
    sse = NULL;
    len = cap = 0;
    cv_api_stream_error(&err, &sse, &len, &cap);
    CHECK_STR_EQ(sse, "data: {\"error\":{\"message\":\"boom\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n");
    free(sse);
}

static void test_metrics_text(void) {
    static const double bounds[] = {0.1, 1.0};
    cv_engine_stats st = {.num_running = 2, .num_waiting = 1, .kv_cache_usage = 0.25, .prompt_tokens = 10,
                          .generation_tokens = 7, .prefix_cache_queries = 32, .prefix_cache_hits = 16,
                          .request_success = {3, 1, 2, 0}, .kv_cache_tokens = 1024, .block_size = 16};
    cv_histogram_init(&st.time_to_first_token, bounds, 2);
    cv_histogram_init(&st.inter_token_latency, bounds, 2);
    cv_histogram_init(&st.e2e_request_latency, bounds, 2);
    cv_histogram_observe(&st.time_to_first_token, 0.05);
    cv_histogram_observe(&st.time_to_first_token, 0.5);
    cv_histogram_observe(&st.time_to_first_token, 5);
    char *t = cv_metrics_render(&st, "q\"3");
    const char *L = "{engine=\"0\",model_name=\"q\\\"3\"}";
    char line[256];
    snprintf(line, sizeof line, "vllm:num_requests_running%s 2\n", L);
    CHECK_CONTAINS(t, line);
    snprintf(line, sizeof line, "vllm:kv_cache_usage_perc%s 0.25\n", L);
    CHECK_CONTAINS(t, line);
    snprintf(line, sizeof line, "vllm:prompt_tokens_total%s 10.0\n", L);
    CHECK_CONTAINS(t, line);
    CHECK_CONTAINS(t, "# TYPE vllm:prefix_cache_hits counter\n");
    CHECK_CONTAINS(t, "vllm:request_success_total{engine=\"0\",model_name=\"q\\\"3\",finished_reason=\"abort\"} 2.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"q\\\"3\",le=\"0.1\"} 1.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"q\\\"3\",le=\"1\"} 2.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"q\\\"3\",le=\"+Inf\"} 3.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"q\\\"3\"} 3.0\n");
    CHECK_CONTAINS(t, "# TYPE vllm:e2e_request_latency_seconds histogram\n");
    CHECK_CONTAINS(t, "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"64\"} 1.0\n");
    free(t);
}

int main(void) {
    CHECK(cvllm_tokenizer_create(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", &tok) == CVLLM_OK);
    if (!tok) return cv_check_summary("test_server_api");
    test_error_json();
    test_completion_fields();
    test_completion_errors();
    test_chatml();
    test_tokenize_parse();
    test_completion_response();
    test_completion_logprobs_and_echo();
    test_chat_stream();
    test_metrics_text();
    cvllm_tokenizer_destroy(tok);
    return cv_check_summary("test_server_api");
}
