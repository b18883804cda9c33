/*
 * test_server_api.c — the protocol layer of the server (src/server/api*.c, metrics.c) without an
 * engine or a socket: request fields, defaults and every kind of 400, chat rendered with the model's
 * Jinja template (compared with the chat library's own rendering), vLLM's context-length rules and
 * messages, response and SSE shapes from synthetic engine events, logprob formats, and the
 * Prometheus text.
 *
 * Chat output parsing is tested through the exact path the server takes (cv_api_response_apply,
 * then the SSE chunks or cv_api_response_json): made-up model outputs with <think> blocks and
 * <tool_call> blocks, cut into events at every byte, must give the expected reasoning, content,
 * tool_calls and finish_reason, and the streamed deltas must add up to the non-streaming message.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/utf8.h"
#include "check.h"
#include "cvllm.h"
#include "server/api.h"
#include "server/request_log.h"
#include "server/beam_driver.h"
#include "server/embed_chunks.h"
#include "server/metrics.h"
#include "testutil.h"

static cvllm_tokenizer *tok;
static cv_chat_template *qwen3_tmpl, *qwen36_tmpl;
/* The Qwen3 recipe: its template, --reasoning-parser qwen3, --enable-auto-tool-choice
 * --tool-call-parser hermes. */
static cv_api_chat_config qwen3_chat;

/* The test checkpoint's vocabulary is 4096; chat needs the full Qwen3 one for its special tokens. */
enum { SMALL_VOCAB = 4096, QWEN3_VOCAB = 151936 };

static cv_api_limits limits(int32_t max_model_len, int32_t vocab) {
    cv_api_limits l = {.max_model_len = max_model_len, .vocab_size = vocab, .max_n = 8, .max_prompts = 4, .gen_max_tokens = -1};
    cvllm_sampling_params_default(NULL, &l.defaults);
    l.defaults.temperature = 0.6f; /* as a generation_config would set it */
    l.chat = &qwen3_chat;
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
    /* The type vLLM sends with each status: its serving code's names, else the HTTP reason phrase its
     * HTTPException handler uses (validate_json_request's 415 up to vLLM 0.11; Starlette's 405). */
    static const struct {
        int status;
        const char *type;
    } types[] = {{400, "BadRequestError"}, {401, "Unauthorized"},        {404, "NotFoundError"},
                 {405, "Method Not Allowed"}, {408, "Request Timeout"}, {413, "RequestEntityTooLarge"},
                 {415, "Unsupported Media Type"}, {431, "Request Header Fields Too Large"},
                 {500, "InternalServerError"}, {501, "NotImplementedError"}, {503, "ServiceUnavailableError"},
                 {505, "HTTP Version Not Supported"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cv_api_fail(&err, types[i].status, NULL, "x");
        CHECK_STR_EQ(err.type, types[i].type);
    }
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

/* Parses `body` as `kind` (a 64-token context); expects vLLM's validation failure: status 400, type
 * "Bad Request", `param` and exactly `message` (pydantic's error list, as vLLM's handler prints it;
 * the expected strings were produced by pydantic 2.13 validating the same body against the field
 * types of vLLM's models). */
static void expect_validation(cv_api_kind kind, const char *body, const char *param, const char *message) {
    cv_api_limits l = limits(64, SMALL_VOCAB);
    cv_api_request req;
    cv_api_error err = {0};
    int rc = kind == CV_API_CHAT ? cv_api_parse_chat(body, strlen(body), &l, &req, &err)
                                 : cv_api_parse_completion(body, strlen(body), &l, &req, &err);
    CHECK_MSG(rc != 0, "accepted: %s", body);
    if (rc) {
        CHECK_EQ_INT(err.status, 400);
        CHECK_STR_EQ(err.type, "Bad Request");
        CHECK_STR_EQ(err.param, param);
        CHECK_STR_EQ(err.message, message);
    }
    cv_api_request_free(&req);
}

static void test_completion_errors(void) {
    const cv_api_kind C = CV_API_COMPLETION;
    expect_error(C, "{\"prompt\": ", 400, "", "JSON decode error");
    expect_error(C, "[1,2]", 400, "", "JSON object");
    expect_error(C, "{\"prompt\":\"a\xff\"}", 400, "", "JSON decode error");
    expect_error(C, "{\"prompt\":\"a\",\"prompt\":NaN}", 400, "", "JSON decode error");
    /* vLLM's validate_prompt_and_prompt_embeds: a missing or empty prompt. */
    expect_validation(C, "{}", "prompt",
                      "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, Either prompt "
                      "or prompt_embeds must be provided and non-empty. (parameter=prompt)', 'input': {}, 'ctx': "
                      "{'error': VLLMValidationError('Either prompt or prompt_embeds must be provided and non-empty.')}}");
    expect_error(C, "{\"prompt\":\"\"}", 400, "prompt", "Either prompt or prompt_embeds must be provided and non-empty.");
    /* The prompt union: every member's errors, as pydantic lists them. */
    expect_validation(C, "{\"prompt\":5}", "body.prompt",
                      "4 validation errors:\n"
                      "  {'type': 'list_type', 'loc': ('body', 'prompt', 'list[constrained-int]'), 'msg': 'Input should be a valid list', 'input': 5}\n"
                      "  {'type': 'list_type', 'loc': ('body', 'prompt', 'list[list[constrained-int]]'), 'msg': 'Input should be a valid list', 'input': 5}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), 'msg': 'Input should be a valid string', 'input': 5}\n"
                      "  {'type': 'list_type', 'loc': ('body', 'prompt', 'list[str]'), 'msg': 'Input should be a valid list', 'input': 5}");
    expect_validation(C, "{\"prompt\":[1,-2]}", "body.prompt.1",
                      "6 validation errors:\n"
                      "  {'type': 'greater_than_equal', 'loc': ('body', 'prompt', 'list[constrained-int]', 1), 'msg': 'Input should be greater than or equal to 0', 'input': -2, 'ctx': {'ge': 0}}\n"
                      "  {'type': 'list_type', 'loc': ('body', 'prompt', 'list[list[constrained-int]]', 0), 'msg': 'Input should be a valid list', 'input': 1}\n"
                      "  {'type': 'list_type', 'loc': ('body', 'prompt', 'list[list[constrained-int]]', 1), 'msg': 'Input should be a valid list', 'input': -2}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), 'msg': 'Input should be a valid string', 'input': [1, -2]}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'list[str]', 0), 'msg': 'Input should be a valid string', 'input': 1}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'list[str]', 1), 'msg': 'Input should be a valid string', 'input': -2}");
    expect_validation(C, "{\"prompt\":[[1],[2,-1]]}", "body.prompt.0",
                      "6 validation errors:\n"
                      "  {'type': 'int_type', 'loc': ('body', 'prompt', 'list[constrained-int]', 0), 'msg': 'Input should be a valid integer', 'input': [1]}\n"
                      "  {'type': 'int_type', 'loc': ('body', 'prompt', 'list[constrained-int]', 1), 'msg': 'Input should be a valid integer', 'input': [2, -1]}\n"
                      "  {'type': 'greater_than_equal', 'loc': ('body', 'prompt', 'list[list[constrained-int]]', 1, 1), 'msg': 'Input should be greater than or equal to 0', 'input': -1, 'ctx': {'ge': 0}}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), 'msg': 'Input should be a valid string', 'input': [[1], [2, -1]]}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'list[str]', 0), 'msg': 'Input should be a valid string', 'input': [1]}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'prompt', 'list[str]', 1), 'msg': 'Input should be a valid string', 'input': [2, -1]}");
    expect_error(C, "{\"prompt\":[\"a\",[1]]}", 400, "body.prompt.0", "5 validation errors");
    expect_error(C, "{\"prompt\":[1,\"a\"]}", 400, "body.prompt.1", "'msg': 'Input should be a valid integer, unable to parse string as an integer', 'input': 'a'}");
    expect_error(C, "{\"prompt\":[]}", 400, "prompt", "empty");
    /* vLLM's validate_prompt_list_length (without its hint about VLLM_MAX_COMPLETION_PROMPTS, which
     * cvllm does not read). */
    expect_error(C, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "prompt",
                 "'msg': 'Value error, prompt list length 5 exceeds the maximum allowed count of 4. (parameter=prompt)'");
    expect_validation(C, "{\"prompt\":\"a\",\"n\":2.5}", "body.n",
                      "1 validation error:\n  {'type': 'int_from_float', 'loc': ('body', 'n'), 'msg': 'Input should be a "
                      "valid integer, got a number with a fractional part', 'input': 2.5}");
    expect_validation(C, "{\"prompt\":\"a\",\"n\":null}", "body.n",
                      "1 validation error:\n  {'type': 'int_type', 'loc': ('body', 'n'), 'msg': 'Input should be a valid "
                      "integer', 'input': None}");
    expect_error(C, "{\"prompt\":\"a\",\"n\":0}", 400, "n", "at least 1");
    expect_error(C, "{\"prompt\":\"a\",\"n\":9}", 400, "n", "at most 8");
    expect_error(C, "{\"prompt\":\"a\",\"n\":4294967297}", 400, "n", "out of range");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":\"ten\"}", 400, "body.max_tokens",
                 "'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be a valid integer, unable to parse string as an integer', 'input': 'ten'");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":1e300}", 400, "body.max_tokens",
                 "'type': 'int_parsing_size', 'loc': ('body', 'max_tokens'), 'msg': 'Unable to parse input string as an integer, exceeded maximum size', 'input': 1e+300}");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":123456789012345678901234567890}", 400, "", "JSON decode error");
    expect_error(C, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "body.temperature",
                 "'msg': 'Input should be a valid number, unable to parse string as a number', 'input': 'hot'");
    expect_error(C, "{\"prompt\":\"a\",\"stream\":2}", 400, "body.stream", "'type': 'bool_parsing'");
    expect_error(C, "{\"prompt\":\"a\",\"stream\":[]}", 400, "body.stream", "'type': 'bool_type'");
    expect_validation(C, "{\"prompt\":\"a\",\"stop\":5}", "body.stop",
                      "2 validation errors:\n"
                      "  {'type': 'string_type', 'loc': ('body', 'stop', 'str'), 'msg': 'Input should be a valid string', 'input': 5}\n"
                      "  {'type': 'list_type', 'loc': ('body', 'stop', 'list[str]'), 'msg': 'Input should be a valid list', 'input': 5}");
    expect_validation(C, "{\"prompt\":\"a\",\"stop\":[\"x\",3]}", "body.stop",
                      "2 validation errors:\n"
                      "  {'type': 'string_type', 'loc': ('body', 'stop', 'str'), 'msg': 'Input should be a valid string', 'input': ['x', 3]}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'stop', 'list[str]', 1), 'msg': 'Input should be a valid string', 'input': 3}");
    expect_error(C, "{\"prompt\":\"a\",\"stop_token_ids\":\"1\"}", 400, "body.stop_token_ids", "'type': 'list_type'");
    expect_error(C, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias", "token_id must be an integer");
    expect_error(C, "{\"prompt\":\"a\",\"logit_bias\":{\"1\":\"x\"}}", 400, "body.logit_bias.1", "'loc': ('body', 'logit_bias', '1')");
    expect_error(C, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
                 "'msg': 'Value error, Stream options can only be defined when `stream=True`. (parameter=stream_options)'");
    expect_error(C, "{\"prompt\":\"a\",\"stream\":true,\"prompt_logprobs\":1}", 400, "prompt_logprobs",
                 "`prompt_logprobs` are not available when `stream=True`.");
    expect_error(C, "{\"prompt\":\"a\",\"logprobs\":-3}", 400, "logprobs",
                 "'Value error, `logprobs` must be a positive value or -1. (parameter=logprobs, value=-3)'");
    expect_error(C, "{\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix", "not currently supported");
    expect_error(C, "{\"prompt\":\"a\",\"use_beam_search\":true,\"structured_outputs\":{\"regex\":\"[ab]+\"}}", 400,
                 "use_beam_search", "beam search does not support structured outputs");
    expect_error(C, "{\"prompt\":\"a\",\"use_beam_search\":\"maybe\"}", 400, "body.use_beam_search", "valid boolean");
    expect_error(C, "{\"prompt\":\"a\",\"length_penalty\":null}", 400, "body.length_penalty", "valid number");
    expect_error(C, "{\"prompt\":\"a\",\"request_id\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}", 400,
                 "request_id", "longer");
    /* Context-length rules and their vLLM wording. */
    expect_error(C, "{\"prompt\":\"I am in the house\",\"max_tokens\":60}", 400, "max_tokens",
                 "'max_tokens' or 'max_completion_tokens' is too large: 60. This model's maximum context length is 64 "
                 "tokens and your request has 5 input tokens (60 > 64 - 5).");
    /* the largest int64: the check must not overflow adding the prompt (fuzz_request found it) */
    expect_error(C, "{\"prompt\":\"I am in the house\",\"max_tokens\":9223372036854775807}", 400, "max_tokens",
                 "is too large: 9223372036854775807. This model's maximum context length is 64 tokens and your request "
                 "has 5 input tokens (9223372036854775807 > 64 - 5).");
    expect_error(C, "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,"
                    "33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64]}",
                 400, "prompt", "This model's maximum context length is 64 tokens. However, your request has 64 input tokens.");
    expect_error(C, "{\"prompt\":[1,4096]}", 400, "prompt", "Token id 4096 is out of vocabulary");
    expect_error(C, "{\"prompt\":[[1],[99999999999]]}", 400, "prompt", "out of vocabulary");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", "at least 1, got 0");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":-5}", 400, "max_tokens", "at least 1, got -5");
    expect_error(C, "{\"prompt\":\"a\",\"max_tokens\":-1}", 400, "max_tokens", "at least 1, got -1");
    expect_error(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}", 400, "max_tokens",
                 "at least 1, got -1");
    /* A text prompt whose tokens are outside the (small) model vocabulary. */
    expect_error(C, "{\"prompt\":\"<|im_start|>\"}", 400, "prompt", "Token id 151644 is out of vocabulary");
}

/* The prompt the chat library renders for these request parts. */
static char *library_prompt(const cv_chat_template *t, const char *messages, const char *tools, const char *documents,
                            const char *kwargs, bool add_generation_prompt) {
    json_t *m = json_loads(messages, 0, NULL), *tl = tools ? json_loads(tools, 0, NULL) : NULL,
           *d = documents ? json_loads(documents, 0, NULL) : NULL, *k = kwargs ? json_loads(kwargs, 0, NULL) : NULL;
    cv_chat_request cr = {.messages = m, .tools = tl, .documents = d, .kwargs = k,
                          .add_generation_prompt = add_generation_prompt};
    char *text = NULL;
    CHECK_MSG(cv_chat_render(t, &cr, &text, NULL) == 0, "%s", cvllm_last_error());
    json_decref(m);
    json_decref(tl);
    json_decref(d);
    json_decref(k);
    return text;
}

#define USER_HI "[{\"role\":\"user\",\"content\":\"Hi\"}]"
#define WEATHER_TOOL                                                                                           \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\","      \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]"

static void test_chat_render(void) {
    cv_api_request r;
    parse_ok(CV_API_CHAT,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":\"text\",\"text\":\"there\"}]}]}",
             &r, 4096);
    /* Qwen3's template frames plain turns as ChatML; content parts are joined by newlines. */
    CHECK_STR_EQ(r.prompts[0].text,
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n");
    /* No max_tokens: the rest of the context. */
    CHECK_EQ_INT(r.prompts[0].max_tokens, 4096 - (int32_t)r.prompts[0].n_ids);
    CHECK_EQ_INT(r.top_logprobs, -1);
    CHECK(r.parse_reasoning && !r.starts_in_reasoning && r.include_reasoning && !r.parse_tool_calls);
    cv_api_request_free(&r);

    /* tools, documents and chat_template_kwargs reach the template as the library passes them. */
    parse_ok(CV_API_CHAT,
             "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"documents\":[{\"title\":\"t\",\"text\":\"d\"}],"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
             &r, 4096);
    char *want = library_prompt(qwen3_tmpl, USER_HI, WEATHER_TOOL, "[{\"title\":\"t\",\"text\":\"d\"}]",
                                "{\"enable_thinking\":false}", true);
    CHECK_STR_EQ(r.prompts[0].text, want);
    CHECK_CONTAINS(r.prompts[0].text, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"");
    CHECK_CONTAINS(r.prompts[0].text, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    CHECK(r.parse_tool_calls && r.tool_choice == CV_TOOL_CHOICE_AUTO && r.tools && r.parallel_tool_calls);
    free(want);
    cv_api_request_free(&r);

    /* reasoning_effort "none" turns thinking off as enable_thinking=false does; a request's own
     * enable_thinking wins. --default-chat-template-kwargs sit under the request's. */
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI ",\"reasoning_effort\":\"none\"}", &r, 4096);
    CHECK(strstr(r.prompts[0].text, "<think>\n\n</think>") != NULL);
    cv_api_request_free(&r);
    parse_ok(CV_API_CHAT,
             "{\"messages\":" USER_HI ",\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"enable_thinking\":true}}",
             &r, 4096);
    CHECK(strstr(r.prompts[0].text, "<think>") == NULL);
    cv_api_request_free(&r);
    json_t *defaults = json_pack("{s:b}", "enable_thinking", 0);
    qwen3_chat.default_kwargs = defaults;
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI "}", &r, 4096);
    CHECK(strstr(r.prompts[0].text, "<think>\n\n</think>") != NULL);
    cv_api_request_free(&r);
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI ",\"chat_template_kwargs\":{\"enable_thinking\":true}}", &r, 4096);
    CHECK(strstr(r.prompts[0].text, "<think>") == NULL);
    cv_api_request_free(&r);
    qwen3_chat.default_kwargs = NULL;
    json_decref(defaults);

    /* continue_final_message leaves the last message open; echo sends its text back. */
    parse_ok(CV_API_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hel\"}],"
             "\"add_generation_prompt\":false,\"continue_final_message\":true,\"echo\":true,\"logprobs\":true,"
             "\"top_logprobs\":3,\"max_tokens\":9,\"max_completion_tokens\":7}",
             &r, 4096);
    CHECK_STR_EQ(r.prompts[0].text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHel");
    CHECK_STR_EQ(r.echo_text, "Hel");
    CHECK_EQ_INT(r.top_logprobs, 3);
    CHECK_EQ_INT(r.params.logprobs, 3);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 7); /* max_completion_tokens wins */
    cv_api_request_free(&r);

    /* Only assistant (and function) messages may have null content, as in vLLM's message types. */
    parse_ok(CV_API_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"\"},{\"role\":\"assistant\",\"content\":null}],"
             "\"logprobs\":true,\"add_generation_prompt\":false}",
             &r, 4096);
    CHECK_STR_EQ(r.prompts[0].text, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n");
    CHECK_EQ_INT(r.top_logprobs, 0); /* logprobs without top_logprobs: the sampled token only */
    cv_api_request_free(&r);

    /* A template that opens <think> in the prompt (Qwen3.6): the output starts in reasoning. */
    cv_api_chat_config c36 = {.tmpl = qwen36_tmpl, .reasoning_parser = true, .has_tool_parser = true,
                              .tool_parser = CV_TOOL_PARSER_QWEN3_CODER, .auto_tool_choice = true};
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.chat = &c36;
    cv_api_error err;
    const char *body = "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"include_reasoning\":false}";
    CHECK(cv_api_parse_chat(body, strlen(body), &l, &r, &err) == 0);
    char *want36 = library_prompt(qwen36_tmpl, USER_HI, WEATHER_TOOL, NULL, NULL, true);
    CHECK_STR_EQ(r.prompts[0].text, want36);
    CHECK(r.starts_in_reasoning && !r.include_reasoning && r.tool_parser == CV_TOOL_PARSER_QWEN3_CODER);
    free(want36);
    cv_api_request_free(&r);

    /* generation_config's max_new_tokens caps the default. */
    l = limits(4096, QWEN3_VOCAB);
    l.gen_max_tokens = 10;
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    CHECK(cv_api_parse_chat(body, strlen(body), &l, &r, &err) == 0 && cv_api_prepare(&r, tok, &l, &err) == 0);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 10);
    cv_api_request_free(&r);
}

/* Parses `body` as chat under `cfg`; expects a 400 with `param` and a message containing `needle`. */
static void expect_chat_error(const cv_api_chat_config *cfg, const char *body, const char *param, const char *needle) {
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.chat = cfg;
    cv_api_request req;
    cv_api_error err = {0};
    int rc = cv_api_parse_chat(body, strlen(body), &l, &req, &err);
    CHECK_MSG(rc != 0, "accepted: %s", body);
    if (rc) {
        CHECK_EQ_INT(err.status, 400);
        CHECK_STR_EQ(err.param, param);
        CHECK_CONTAINS(err.message, needle);
    }
    cv_api_request_free(&req);
}

/* --trust-request-chat-template: without it a template in the request (its chat_template, or one in
 * chat_template_kwargs) is refused as vLLM refuses it; with it the request's chat_template renders
 * the messages, with the server template's special tokens (none when the server has no template),
 * its content format detected from it, and its parse errors are 400s. */
static void test_request_template(void) {
    cv_api_chat_config plain = {.tmpl = qwen3_tmpl}, trusted = {.tmpl = qwen3_tmpl, .trust_request_template = true},
                       bare = {.trust_request_template = true};
    static const char own[] = "{\"messages\":" USER_HI ",\"chat_template\":"
                              "\"{% for m in messages %}<{{ m.content }}>{% endfor %}{{ eos_token }}\"}";
    expect_chat_error(&plain, own, "chat_template", "--trust-request-chat-template is not set");
    expect_chat_error(&plain, "{\"messages\":" USER_HI ",\"chat_template_kwargs\":{\"chat_template\":\"x\"}}",
                      "chat_template", "Refused request with untrusted chat template.");
    expect_chat_error(&trusted, "{\"messages\":" USER_HI ",\"chat_template_kwargs\":{\"chat_template\":\"x\"}}", "",
                      "Found unexpected chat template kwargs from request: {'chat_template'}");
    expect_chat_error(&trusted, "{\"messages\":" USER_HI ",\"chat_template\":\"{% for m in messages %}\"}", "",
                      "line 1");
    /* a hostile one meets the renderer's budgets (steps, memory): a 400, not a hung worker */
    expect_chat_error(&trusted, "{\"messages\":" USER_HI ",\"chat_template\":\"{% for i in range(100000) %}"
                      "{% for j in range(100000) %}x{% endfor %}{% endfor %}\"}", "", "chat template: line 1: rendering");
    const struct {
        const cv_api_chat_config *cfg;
        const char *body, *want;
    } cases[] = {
        {&trusted, own, "<Hi><|im_end|>"},
        {&bare, own, "<Hi>"}, /* no server template, so no special tokens: eos_token is undefined, "" */
        /* a template that loops over content parts gets them (format detected from it, not the server's) */
        {&trusted,
         "{\"messages\":" USER_HI ",\"chat_template\":\"{% for m in messages %}{% for p in m.content %}[{{ p.text }}]"
         "{% endfor %}{% endfor %}\"}",
         "[Hi]"},
        /* without a template of its own the request gets the server's */
        {&trusted, "{\"messages\":" USER_HI ",\"chat_template_kwargs\":{\"enable_thinking\":false}}",
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cv_api_limits l = limits(4096, QWEN3_VOCAB);
        l.chat = cases[i].cfg;
        cv_api_request r;
        cv_api_error err = {0};
        CHECK_MSG(cv_api_parse_chat(cases[i].body, strlen(cases[i].body), &l, &r, &err) == 0, "case %zu: %s", i,
                  err.message);
        CHECK_MSG(r.n_prompts == 1 && !strcmp(r.prompts[0].text, cases[i].want), "case %zu: %s", i,
                  r.n_prompts ? r.prompts[0].text : "(none)");
        cv_api_request_free(&r);
    }
}

static void test_chat_errors(void) {
    const cv_api_kind H = CV_API_CHAT;
    expect_validation(H, "{}", "body.messages",
                      "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required', 'input': {}}");
    expect_validation(H, "{\"messages\":\"hi\"}", "body.messages",
                      "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages'), 'msg': 'Input should be a valid list', 'input': 'hi'}");
    expect_error(H, "{\"messages\":[]}", 400, "messages", "must not be empty");
    /* Messages and their content parts, located where they sit (vLLM lists one error per message type
     * of its union; cvllm reports the one of the type the message's role and the part's type name). */
    expect_validation(H, "{\"messages\":[{\"content\":\"x\"}]}", "body.messages.0.role",
                      "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages', 0, 'role'), 'msg': 'Field required', 'input': {'content': 'x'}}");
    expect_validation(H, "{\"messages\":[{\"role\":5,\"content\":\"x\"}]}", "body.messages.0.role",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 0, 'role'), 'msg': 'Input should be a valid string', 'input': 5}");
    expect_validation(H, "{\"messages\":[3]}", "body.messages.0",
                      "1 validation error:\n  {'type': 'dict_type', 'loc': ('body', 'messages', 0), 'msg': 'Input should be a valid dictionary', 'input': 3}");
    expect_validation(H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "body.messages.0.content",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 0, 'content'), 'msg': 'Input should be a valid string', 'input': 5}");
    expect_validation(H, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", "body.messages.0.content",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 0, 'content'), 'msg': 'Input should be a valid string', 'input': None}");
    expect_validation(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":7}]}", "body.messages.0.name",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 0, 'name'), 'msg': 'Input should be a valid string', 'input': 7}");
    /* A text part without text, or with a text that is not a string. */
    expect_validation(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "body.messages.0.content.0.text",
                      "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages', 0, 'content', 0, 'text'), 'msg': 'Field required', 'input': {'type': 'text'}}");
    expect_validation(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}", "body.messages.0.content.0.text",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 0, 'content', 0, 'text'), 'msg': 'Input should be a valid string', 'input': 1}");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"thinking\"}]}]}", 400,
                 "body.messages.0.content.0.thinking", "'type': 'missing'");
    /* vLLM's content parser: unknown part types, untyped parts, media on a text-only model. */
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"foo\",\"x\":1}]}]}", 400, "type",
                 "Unsupported chat content part type: 'foo'. Supported types: audio_embeds, audio_url, image_embeds, "
                 "image_pil, image_url, input_audio, input_image, input_text, output_text, prompt_embeds, refusal, text, "
                 "thinking, tool_reference, video_embeds, video_url. (parameter=type, value=foo)");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"x\":1}]}]}", 400, "type",
                 "Missing 'type' field in multimodal part. (parameter=type)");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":3}]}]}", 400, "type",
                 "Invalid 'type' field in multimodal part. (parameter=type)");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":3,\"image_url\":\"http://x/a.png\"}]}]}", 400,
                 "type", "Invalid 'type' field in multimodal part.");
    cv_api_limits named = limits(64, SMALL_VOCAB);
    named.served_model = "Qwen/Qwen3-0.6B";
    cv_api_request r;
    cv_api_error err;
    const char *image = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/a.png\"}}]}]}";
    CHECK(cv_api_parse_chat(image, strlen(image), &named, &r, &err) != 0);
    CHECK_EQ_INT(err.status, 400);
    CHECK_STR_EQ(err.type, "BadRequestError");
    CHECK_STR_EQ(err.message, "Qwen/Qwen3-0.6B is not a multimodal model");
    cv_api_request_free(&r);
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"image_url\":\"http://x/a.png\"}]}]}", 400, "",
                 "model is not a multimodal model");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":{}}]}]}", 400, "",
                 "is not a multimodal model");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"prompt_embeds\",\"data\":\"AAAA\"}]}]}", 400, "",
                 "You must set `--enable-prompt-embeds` to input `prompt_embeds`.");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"mm_processor_kwargs\":{\"fps\":2}}", 400, "",
                 "model is not a multimodal model");
    /* An assistant's tool_calls: id, function.name and function.arguments are strings, type is 'function'. */
#define CALLS(call) "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[" call "]}]}"
    expect_validation(H, CALLS("{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":5,\"arguments\":\"{}\"}}"),
                      "body.messages.1.tool_calls.0.function.name",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, 'tool_calls', 0, 'function', 'name'), 'msg': 'Input should be a valid string', 'input': 5}");
    expect_validation(H, CALLS("{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}"),
                      "body.messages.1.tool_calls.0.function.arguments",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, 'tool_calls', 0, 'function', 'arguments'), 'msg': 'Input should be a valid string', 'input': {'a': 1}}");
    expect_validation(H, CALLS("{\"id\":1,\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}"),
                      "body.messages.1.tool_calls.0.id",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, 'tool_calls', 0, 'id'), 'msg': 'Input should be a valid string', 'input': 1}");
    expect_error(H, CALLS("{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}"), 400,
                 "body.messages.1.tool_calls.0.id", "'type': 'missing'");
    expect_error(H, CALLS("{\"id\":\"c1\",\"type\":\"tool\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}"), 400,
                 "body.messages.1.tool_calls.0.type", "'msg': \"Input should be 'function'\"");
    expect_error(H, CALLS("{\"id\":\"c1\",\"type\":\"function\"}"), 400, "body.messages.1.tool_calls.0.function",
                 "'type': 'missing'");
    expect_error(H, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":{}}]}", 400,
                 "body.messages.0.tool_calls", "'type': 'list_type'");
#undef CALLS
    /* check_generation_prompt: a VLLMValidationError without a parameter, so the body is named. */
    expect_validation(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true,\"add_generation_prompt\":true}",
                      "body",
                      "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, Cannot set "
                      "both `continue_final_message` and `add_generation_prompt` to True.', 'input': {'messages': "
                      "[{'role': 'user', 'content': 'x'}], 'continue_final_message': True, 'add_generation_prompt': "
                      "True}, 'ctx': {'error': VLLMValidationError('Cannot set both `continue_final_message` and "
                      "`add_generation_prompt` to True.')}}");
    /* add_generation_prompt left at its default: transformers' apply_chat_template refuses the pair. */
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true}", 400, "",
                 "continue_final_message and add_generation_prompt are not compatible.");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "top_logprobs",
                 "when using `top_logprobs`, `logprobs` must be set to true.");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":\"2\",\"logprobs\":true}", 400,
                 "top_logprobs", "`top_logprobs` must be an integer. (parameter=top_logprobs, value=2)");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":\"maybe\"}", 400, "body.logprobs", "bool_parsing");
    expect_error(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":[1]}", 400,
                 "body.max_completion_tokens", "'type': 'int_type'");

    const cv_api_chat_config *q = &qwen3_chat;
    /* Qwen3.6's template raises for a late system message: its message, verbatim. */
    cv_api_chat_config c36 = {.tmpl = qwen36_tmpl};
    cv_api_limits l36 = limits(4096, QWEN3_VOCAB);
    l36.chat = &c36;
    const char *late = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}";
    CHECK(cv_api_parse_chat(late, strlen(late), &l36, &r, &err) != 0);
    CHECK_EQ_INT(err.status, 400);
    CHECK_STR_EQ(err.message, "System message must be at the beginning.");
    cv_api_request_free(&r);
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"chat_template_kwargs\":[1]}", "body.chat_template_kwargs", "'type': 'dict_type'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"chat_template_kwargs\":{\"tokenize\":true}}", "",
                      "Found unexpected chat template kwargs from request: {'tokenize'}");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"chat_template\":\"{{ 1 }}\"}", "chat_template",
                      "--trust-request-chat-template is not set");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"chat_template\":5}", "body.chat_template", "'type': 'string_type'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"documents\":\"d\"}", "body.documents", "'type': 'list_type'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"documents\":[{\"title\":1}]}", "body.documents.0.title", "'type': 'string_type'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"media_io_kwargs\":{\"image\":5}}", "body.media_io_kwargs.image", "'type': 'dict_type'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"reasoning_effort\":\"huge\"}", "body.reasoning_effort",
                      "{'type': 'literal_error', 'loc': ('body', 'reasoning_effort'), 'msg': \"Input should be 'none', "
                      "'minimal', 'low', 'medium', 'high', 'xhigh' or 'max'\", 'input': 'huge', 'ctx': {'expected': "
                      "\"'none', 'minimal', 'low', 'medium', 'high', 'xhigh' or 'max'\"}}");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"include_reasoning\":2}", "body.include_reasoning", "bool_parsing");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"include_reasoning\":null}", "body.include_reasoning", "bool_type");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"parallel_tool_calls\":\"sometimes\"}", "body.parallel_tool_calls", "bool_parsing");
    /* tools: list[ChatCompletionToolsParam], each a function tool with a FunctionDefinition. */
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":\"x\"}", "body.tools", "'type': 'list_type'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[5]}", "body.tools.0",
                      "1 validation error:\n  {'type': 'model_type', 'loc': ('body', 'tools', 0), 'msg': 'Input should be "
                      "a valid dictionary or instance of ChatCompletionToolsParam', 'input': 5, 'ctx': {'class_name': "
                      "'ChatCompletionToolsParam'}}");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[{\"type\":\"x\",\"function\":{\"name\":\"f\"}}]}", "body.tools.0.type",
                      "{'type': 'literal_error', 'loc': ('body', 'tools', 0, 'type'), 'msg': \"Input should be 'function'\", "
                      "'input': 'x', 'ctx': {'expected': \"'function'\"}}");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[{}]}", "body.tools.0.function",
                      "{'type': 'missing', 'loc': ('body', 'tools', 0, 'function'), 'msg': 'Field required', 'input': {}}");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[{\"function\":5}]}", "body.tools.0.function",
                      "'msg': 'Input should be a valid dictionary or instance of FunctionDefinition'");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[{\"function\":{\"name\":5}}]}", "body.tools.0.function.name",
                      "{'type': 'string_type', 'loc': ('body', 'tools', 0, 'function', 'name'), 'msg': 'Input should be a "
                      "valid string', 'input': 5}");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[{\"function\":{\"name\":\"f\",\"parameters\":[1]}}]}",
                      "body.tools.0.function.parameters", "'type': 'dict_type'");
    /* A named tool_choice of another type fails every member of tool_choice's union. */
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":{\"type\":\"foo\",\"function\":{\"name\":\"get_weather\"}}}",
                      "body.tool_choice",
                      "4 validation errors:\n"
                      "  {'type': 'literal_error', 'loc': ('body', 'tool_choice', \"literal['none']\"), 'msg': \"Input should be 'none'\", 'input': {'type': 'foo', 'function': {'name': 'get_weather'}}, 'ctx': {'expected': \"'none'\"}}\n"
                      "  {'type': 'literal_error', 'loc': ('body', 'tool_choice', \"literal['auto']\"), 'msg': \"Input should be 'auto'\", 'input': {'type': 'foo', 'function': {'name': 'get_weather'}}, 'ctx': {'expected': \"'auto'\"}}\n"
                      "  {'type': 'literal_error', 'loc': ('body', 'tool_choice', \"literal['required']\"), 'msg': \"Input should be 'required'\", 'input': {'type': 'foo', 'function': {'name': 'get_weather'}}, 'ctx': {'expected': \"'required'\"}}\n"
                      "  {'type': 'literal_error', 'loc': ('body', 'tool_choice', 'ChatCompletionNamedToolChoiceParam', 'type'), 'msg': \"Input should be 'function'\", 'input': 'foo', 'ctx': {'expected': \"'function'\"}}");
    /* tool_choice: check_tool_usage's messages and params (chat_completion/protocol.py), raised before
     * field validation and so wrapped as a value_error. */
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":[]}", "tools",
                      "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tool_choice\":\"auto\"}", "tool_choice",
                      "When using `tool_choice`, `tools` must be set.");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":\"sometimes\"}", "tool_choice",
                      "Invalid value for `tool_choice`: sometimes!");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
                      "tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":{\"type\":\"function\"}}",
                      "tool_choice.function", "Invalid value for `function`: `None` in `tool_choice`!");
    expect_chat_error(q, "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":{\"function\":{\"name\":\"\"}}}",
                      "tool_choice.function.name", "Invalid `name` in `function`: `` in `tool_choice`!");
    cv_api_chat_config no_auto = {.tmpl = qwen3_tmpl, .has_tool_parser = true};
    expect_chat_error(&no_auto, "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL "}", "",
                      "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
    /* No template at all: vLLM's refusal. */
    expect_chat_error(NULL, "{\"messages\":" USER_HI "}", "", "default chat template is no longer allowed");
    /* An error raised while rendering is a 400 with the template's message. */
    cv_chat_template *raising;
    const char *src = "{% if messages|length > 1 %}{{ raise_exception('Only one message, please!') }}{% endif %}"
                      "{{ messages[0].content }}";
    CHECK(cv_chat_template_from_string(src, strlen(src), NULL, &raising) == 0);
    cv_api_chat_config rc = {.tmpl = raising};
    expect_chat_error(&rc, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]}", "",
                      "Only one message, please!");
    cv_chat_template_free(raising);
}

static void test_tokenize_parse(void) {
    cv_api_request r;
    cv_api_error err;
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    const char *b = "{\"prompt\":\"hi\",\"return_token_strs\":true}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) == 0);
    CHECK(r.return_token_strs && r.add_special_tokens);
    CHECK_STR_EQ(r.prompts[0].text, "hi");
    cv_api_request_free(&r);
    /* vLLM's chat form: the template's rendering of messages, tools and kwargs. */
    b = "{\"messages\":" USER_HI ",\"add_generation_prompt\":false,\"tools\":" WEATHER_TOOL ","
        "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) == 0);
    char *want = library_prompt(qwen3_tmpl, USER_HI, WEATHER_TOOL, NULL, "{\"enable_thinking\":false}", false);
    CHECK_STR_EQ(r.prompts[0].text, want);
    free(want);
    cv_api_request_free(&r);
    /* vLLM's TokenizeChatRequest has no check_tool_usage: an empty tools list renders as none, and
     * documents and reasoning_effort, which it does not have, are ignored. */
    b = "{\"messages\":" USER_HI ",\"tools\":[],\"documents\":[{\"title\":\"t\",\"text\":\"d\"}],\"reasoning_effort\":\"none\"}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) == 0);
    want = library_prompt(qwen3_tmpl, USER_HI, "[]", NULL, NULL, true);
    CHECK_STR_EQ(r.prompts[0].text, want);
    CHECK(strstr(r.prompts[0].text, "<think>") == NULL);
    free(want);
    cv_api_request_free(&r);
    b = "{\"messages\":" USER_HI ",\"tools\":[{\"type\":\"function\"}]}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) != 0);
    CHECK_STR_EQ(err.param, "body.TokenizeChatRequest.tools.0.function");
    cv_api_request_free(&r);
    l.chat = NULL;
    b = "{\"messages\":" USER_HI "}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) != 0 && err.status == 400);
    cv_api_request_free(&r);
    b = "{\"prompt\":3}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) != 0 && err.status == 400);
    CHECK_STR_EQ(err.param, "body.TokenizeCompletionRequest.prompt");
    cv_api_request_free(&r);
    /* Neither form: both members of vLLM's TokenizeRequest union report their missing field. */
    b = "{\"model\":\"m\"}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) != 0);
    CHECK_STR_EQ(err.param, "body.TokenizeCompletionRequest.prompt");
    CHECK_STR_EQ(err.message,
                 "2 validation errors:\n"
                 "  {'type': 'missing', 'loc': ('body', 'TokenizeCompletionRequest', 'prompt'), 'msg': 'Field required', 'input': {'model': 'm'}}\n"
                 "  {'type': 'missing', 'loc': ('body', 'TokenizeChatRequest', 'messages'), 'msg': 'Field required', 'input': {'model': 'm'}}");
    cv_api_request_free(&r);
    b = "{\"prompt\":\"hi\",\"add_special_tokens\":\"x\"}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) != 0);
    CHECK_STR_EQ(err.param, "body.TokenizeCompletionRequest.add_special_tokens");
    cv_api_request_free(&r);
    /* add_special_tokens: true for a prompt, false for the chat form, as vLLM's defaults. */
    l.chat = &qwen3_chat;
    b = "{\"messages\":" USER_HI "}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) == 0 && !r.add_special_tokens);
    cv_api_request_free(&r);
    b = "{\"messages\":" USER_HI ",\"continue_final_message\":true,\"add_generation_prompt\":true}";
    CHECK(cv_api_parse_tokenize(b, strlen(b), &l, &r, &err) != 0);
    CHECK_STR_EQ(err.param, "body");
    CHECK_CONTAINS(err.message, "'ctx': {'error': ValueError('Cannot set both `continue_final_message` and `add_generation_prompt` to True.')}");
    cv_api_request_free(&r);
    b = "{\"tokens\":[40,1079]}";
    CHECK(cv_api_parse_detokenize(b, strlen(b), &r, &err) == 0);
    CHECK_EQ_INT(r.prompts[0].n_ids, 2);
    cv_api_request_free(&r);
    b = "{\"tokens\":[\"a\"]}";
    CHECK(cv_api_parse_detokenize(b, strlen(b), &r, &err) != 0);
    CHECK_STR_EQ(err.param, "body.tokens.0");
    cv_api_request_free(&r);
    b = "{}";
    CHECK(cv_api_parse_detokenize(b, strlen(b), &r, &err) != 0 && strstr(err.message, "required"));
    cv_api_request_free(&r);
}

/* --chat-template-content-format reaches the template through cv_api_chat_config: with Qwen3.6's
 * template (detected "openai") a part list in every role is concatenated by default, joined with
 * newlines under "string"; tool results are always joined (vLLM flattens tool content). Expected
 * strings computed with tools/gen_chat_corpus.py's transformers-style rendering. */
#define PART_MESSAGES                                                                                                  \
    "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"Be brief.\"},{\"type\":\"text\",\"text\":\"No lists.\"}]},"   \
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather in\"},{\"type\":\"text\",\"text\":\"Paris?\"}]},"         \
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Checking\"},{\"type\":\"text\",\"text\":\"now.\"}],"          \
    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","                             \
    "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"                                                                         \
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":[{\"type\":\"text\",\"text\":\"21 C\"},{\"type\":\"text\",\"text\":\"sunny\"}]}," \
    "{\"role\":\"user\",\"content\":\"Thanks\"}]"

static void test_chat_content_format(void) {
    static const char tail[] = "<|im_start|>user\n<tool_response>\n21 C\nsunny\n</tool_response><|im_end|>\n"
                               "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n";
    static const char calls[] = "\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                                "</function>\n</tool_call><|im_end|>\n";
    char *joined = tu_strdupf("<|im_start|>system\nBe brief.\nNo lists.<|im_end|>\n<|im_start|>user\nWeather in\n"
                              "Paris?<|im_end|>\n<|im_start|>assistant\nChecking\nnow.%s%s", calls, tail);
    char *concatenated = tu_strdupf("<|im_start|>system\nBe brief.No lists.<|im_end|>\n<|im_start|>user\nWeather "
                                    "inParis?<|im_end|>\n<|im_start|>assistant\nCheckingnow.%s%s", calls, tail);
    const struct { cv_chat_content_format f; const char *want; } cases[] = {
        {CV_CHAT_CONTENT_AUTO, concatenated}, {CV_CHAT_CONTENT_STRING, joined}, {CV_CHAT_CONTENT_OPENAI, concatenated}};
    const char *body = "{\"messages\":" PART_MESSAGES "}";
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cv_api_chat_config c36 = {.tmpl = qwen36_tmpl, .content_format = cases[i].f, .has_tool_parser = true,
                                  .tool_parser = CV_TOOL_PARSER_QWEN3_CODER, .auto_tool_choice = true};
        cv_api_limits l = limits(4096, QWEN3_VOCAB);
        l.chat = &c36;
        cv_api_request r;
        cv_api_error err = {0};
        CHECK_MSG(cv_api_parse_chat(body, strlen(body), &l, &r, &err) == 0, "%s", err.message);
        CHECK_MSG(r.n_prompts && !strcmp(r.prompts[0].text, cases[i].want), "content format %s: %s",
                  cv_chat_content_format_name(cases[i].f), r.n_prompts ? r.prompts[0].text : "");
        cv_api_request_free(&r);
    }
    free(joined);
    free(concatenated);
}

/* The log lines a parse writes to stderr (the test runs with CVLLM_LOG_LEVEL=debug). */
static char *parse_log(cv_api_kind kind, const char *body, int *rc) {
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    cv_api_request r;
    cv_api_error err;
    char path[] = "/tmp/cvllm-api-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    *rc = kind == CV_API_CHAT ? cv_api_parse_chat(body, strlen(body), &l, &r, &err)
                              : cv_api_parse_completion(body, strlen(body), &l, &r, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    cv_api_request_free(&r);
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    CHECK(pread(fd, text, (size_t)size, 0) == size);
    close(fd);
    unlink(path);
    return text;
}

static size_t count_of(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Fields outside vLLM's request models are ignored and logged, as OpenAIBaseModel does
 * (vllm/entrypoints/openai/engine/protocol.py): a DEBUG line per request, as a Python set; the removed
 * guided_* fields also warn, once per combination. best_of is such a field since vLLM v1 dropped it
 * (PR #29090): any value is accepted and changes nothing. */
static void test_ignored_fields(void) {
    int rc;
    char *log = parse_log(CV_API_COMPLETION, "{\"prompt\":\"hi\",\"best_of\":3,\"n\":1,\"it's\":{},\"max_tokens\":2}", &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(count_of(log, "The following fields were present in the request but ignored: {'best_of', \"it's\"}\n"), 1);
    CHECK(strstr(log, "DEBUG") != NULL && strstr(log, "WARNING") == NULL);
    free(log);
    cv_api_request r;
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"I am\",\"best_of\":5,\"n\":2}", &r, 64);
    CHECK_EQ_INT(r.params.n, 2);
    cv_api_request_free(&r);

    /* Fields of vLLM's models are not reported, even those this server does not act on. */
    log = parse_log(CV_API_CHAT, "{\"messages\":" USER_HI ",\"priority\":0,\"user\":\"u\",\"documents\":[]}", &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_STR_EQ(log, "");
    free(log);
    /* A chat request is checked against ChatCompletionRequest: "prompt" is not one of its fields. */
    log = parse_log(CV_API_CHAT, "{\"messages\":" USER_HI ",\"prompt\":\"x\",\"guided_json\":{},\"guided_choice\":[\"a\"]}", &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_CONTAINS(log, "ignored: {'prompt', 'guided_json', 'guided_choice'}");
    CHECK_EQ_INT(count_of(log, "Request contains the removed guided-decoding field(s) ['guided_choice', 'guided_json'], "
                               "which are ignored; output will NOT be constrained. Use `structured_outputs` (or "
                               "`response_format`) instead; see docs/features/structured_outputs.md."), 1);
    free(log);
    log = parse_log(CV_API_CHAT, "{\"messages\":" USER_HI ",\"guided_choice\":[\"b\"],\"guided_json\":{}}", &rc);
    CHECK_EQ_INT(count_of(log, "removed guided-decoding"), 0); /* the same combination: warned already */
    CHECK_EQ_INT(count_of(log, "ignored: {'guided_choice', 'guided_json'}"), 1);
    free(log);
    log = parse_log(CV_API_COMPLETION, "{\"prompt\":\"hi\",\"guided_regex\":\"a+\"}", &rc);
    CHECK_EQ_INT(count_of(log, "removed guided-decoding field(s) ['guided_regex']"), 1);
    free(log);
    /* A request that fails validation is not logged: vLLM logs after its model validated. */
    log = parse_log(CV_API_COMPLETION, "{\"prompt\":3,\"best_of\":2}", &rc);
    CHECK(rc != 0);
    CHECK_STR_EQ(log, "");
    free(log);
}

/* /tokenize's token_strs are convert_ids_to_tokens' strings: each id from the real Qwen3 tokenizer
 * must map to its entry in tokenizer.json (model.vocab, or added_tokens' content), read here
 * independently. */
static void test_token_strs(void) {
    json_error_t e;
    json_t *tj = json_load_file(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer/tokenizer.json", 0, &e);
    CHECK_MSG(tj != NULL, "tokenizer.json: %s", e.text);
    if (!tj) return;
    const char **by_id = calloc(QWEN3_VOCAB, sizeof *by_id);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(tj, "model"), "vocab"), key, v)
        if (json_integer_value(v) < QWEN3_VOCAB) by_id[json_integer_value(v)] = key;
    size_t i;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, v)
        by_id[json_integer_value(json_object_get(v, "id"))] = json_string_value(json_object_get(v, "content"));
    const char *text = "Hello world\n\n<|im_start|>user\t café 中文 <think>x</think>\xf0\x9f\xa4\x96!";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(cvllm_tokenize(tok, text, strlen(text), &ids, &n) == CVLLM_OK);
    json_t *strs = cv_api_token_strs(tok, ids, n);
    CHECK_EQ_INT(json_array_size(strs), n);
    for (size_t k = 0; k < n; k++)
        CHECK_MSG(by_id[ids[k]] && !strcmp(json_string_value(json_array_get(strs, k)), by_id[ids[k]]),
                  "token %zu (id %d): %s", k, ids[k], json_string_value(json_array_get(strs, k)));
    /* Byte-level spellings: Ġ for a space, Ċ for a newline, the special token as its content. */
    char *joined = NULL;
    size_t len = 0, cap = 0;
    for (size_t k = 0; k < n; k++) {
        const char *t = json_string_value(json_array_get(strs, k));
        cv_buf_append(&joined, &len, &cap, t, strlen(t));
        cv_buf_append(&joined, &len, &cap, "|", 1);
    }
    CHECK_CONTAINS(joined, "Hello|\xc4\xa0world|\xc4\x8a\xc4\x8a|<|im_start|>|user|");
    CHECK_CONTAINS(joined, "<think>|x|</think>|");
    free(joined);
    json_decref(strs);
    /* An id without a token (between the added tokens and the padded vocabulary) is null. */
    int32_t hole = QWEN3_VOCAB - 1;
    CHECK(by_id[hole] == NULL);
    strs = cv_api_token_strs(tok, &hole, 1);
    CHECK(json_is_null(json_array_get(strs, 0)));
    json_decref(strs);
    cvllm_free(ids);
    free(by_id);
    json_decref(tj);
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

/* ------------------------------------------------------------------------------------------------ */
/* Chat output through the reasoning and tool-call parsers                                          */

/* What one choice came to: reasoning and content ("" when absent), calls, finish_reason. */
typedef struct chat_out {
    char reasoning[1024], content[1024];
    bool has_reasoning, has_content;  /* non-streaming: the field is a string, not null */
    char names[4][64], args[4][256];
    size_t n_calls;
    char finish[32];
    size_t n_logprobs;                /* streaming: logprob entries over all chunks */
    bool well_formed;
} chat_out;

static void cat(char *dst, size_t cap, const char *s) {
    size_t n = strlen(dst);
    snprintf(dst + n, cap - n, "%s", s);
}

/* "chatcmpl-tool-" and 32 lowercase hex digits, as vLLM makes them. */
static bool tool_call_id_ok(const json_t *id) {
    const char *s = json_string_value(id);
    if (!s || strncmp(s, "chatcmpl-tool-", 14) || strlen(s) != 14 + 32) return false;
    for (const char *p = s + 14; *p; p++)
        if (!strchr("0123456789abcdef", *p)) return false;
    return true;
}

static void read_call(chat_out *o, const json_t *call, bool streamed) {
    const json_t *fn = json_object_get(call, "function");
    size_t at = (size_t)json_integer_value(json_object_get(call, "index"));
    if (streamed && !json_object_get(call, "id")) {
        /* a piece of the arguments of the call being streamed (vLLM's named tool choice) */
        const json_t *args = json_object_get(fn, "arguments");
        o->well_formed &= o->n_calls > 0 && at + 1 == o->n_calls && json_is_string(args) && json_object_size(fn) == 1 &&
                          json_object_size(call) == 2;
        if (o->well_formed) cat(o->args[at], sizeof o->args[at], json_string_value(args));
        return;
    }
    o->well_formed &= tool_call_id_ok(json_object_get(call, "id")) &&
                      !strcmp(json_string_value(json_object_get(call, "type")), "function") &&
                      json_is_string(json_object_get(fn, "name")) && json_is_string(json_object_get(fn, "arguments"));
    size_t k = streamed ? (size_t)json_integer_value(json_object_get(call, "index")) : o->n_calls;
    o->well_formed &= !streamed || json_is_integer(json_object_get(call, "index"));
    if (k >= 4 || k != o->n_calls) {
        o->well_formed = false;
        return;
    }
    snprintf(o->names[k], sizeof o->names[k], "%s", json_string_value(json_object_get(fn, "name")));
    snprintf(o->args[k], sizeof o->args[k], "%s", json_string_value(json_object_get(fn, "arguments")));
    o->n_calls++;
}

static void read_message(chat_out *o, const json_t *msg, bool legacy) {
    const json_t *r = json_object_get(msg, "reasoning"), *c = json_object_get(msg, "content");
    o->has_reasoning = json_is_string(r);
    o->has_content = json_is_string(c);
    o->well_formed &= (o->has_reasoning || json_is_null(r)) && (o->has_content || json_is_null(c));
    if (legacy) o->well_formed &= json_equal(r, json_object_get(msg, "reasoning_content"));
    else o->well_formed &= json_object_get(msg, "reasoning_content") == NULL;
    if (o->has_reasoning) cat(o->reasoning, sizeof o->reasoning, json_string_value(r));
    if (o->has_content) cat(o->content, sizeof o->content, json_string_value(c));
    const json_t *calls = json_object_get(msg, "tool_calls");
    o->well_formed &= json_is_array(calls);
    for (size_t i = 0; i < json_array_size(calls); i++) read_call(o, json_array_get(calls, i), false);
}

static void read_stream(chat_out *o, const char *sse, bool legacy) {
    char (*ev)[2048] = malloc(600 * sizeof *ev);
    size_t n = sse_events(sse, ev, 600);
    o->well_formed &= n >= 2 && !strcmp(ev[n - 1], "[DONE]");
    for (size_t e = 0; e + 1 < n; e++) {
        json_t *j = json_loads(ev[e], 0, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *d = json_object_get(ch, "delta");
        o->well_formed &= json_is_object(d) && !o->finish[0]; /* nothing after the finishing chunk */
        const json_t *r = json_object_get(d, "reasoning"), *c = json_object_get(d, "content");
        const json_t *rc = json_object_get(d, "reasoning_content");
        if (legacy) o->well_formed &= r == rc || json_equal(r, rc);
        else o->well_formed &= rc == NULL;
        if (json_is_string(r)) cat(o->reasoning, sizeof o->reasoning, json_string_value(r));
        if (json_is_string(c)) cat(o->content, sizeof o->content, json_string_value(c));
        json_t *calls = json_object_get(d, "tool_calls");
        for (size_t i = 0; i < json_array_size(calls); i++) read_call(o, json_array_get(calls, i), true);
        o->n_logprobs += json_array_size(json_object_get(json_object_get(ch, "logprobs"), "content"));
        if (json_is_string(json_object_get(ch, "finish_reason")))
            snprintf(o->finish, sizeof o->finish, "%s", json_string_value(json_object_get(ch, "finish_reason")));
        json_decref(j);
    }
    free(ev);
}

/* Runs `text` (cut before each offset in `cuts`, one token per piece) through the response of the
 * chat request `body` (JSON without the closing brace) as the server does, streamed or not. */
static chat_out run_chat(const cv_api_chat_config *cfg, const char *body, bool stream, const char *text,
                         const size_t *cuts, size_t n_cuts, cvllm_finish_reason finish) {
    chat_out o = {.well_formed = true};
    char full[4096];
    snprintf(full, sizeof full, "%s%s}", body, stream ? ",\"stream\":true" : "");
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.chat = cfg;
    cv_api_request r;
    cv_api_error err;
    if (cv_api_parse_chat(full, strlen(full), &l, &r, &err) || cv_api_prepare(&r, tok, &l, &err)) {
        CHECK_MSG(0, "%s: %s", full, err.message);
        cv_api_request_free(&r);
        return o;
    }
    cv_api_response resp;
    cv_api_response_init(&resp, &r, tok, "qwen3", false);
    char *sse = NULL;
    size_t len = 0, cap = 0, start = 0, n_text = strlen(text);
    int32_t id = 40;
    cvllm_position_logprobs lp = {.chosen = {40, -1.0f, 1}};
    for (size_t k = 0; k <= n_cuts; k++) {
        size_t end = k < n_cuts ? cuts[k] : n_text;
        bool last = k == n_cuts;
        cv_completion_delta d = {.index = 0, .token_ids = &id, .n_token_ids = 1, .text = (char *)text + start,
                                 .text_len = end - start, .logprobs = r.top_logprobs >= 0 ? &lp : NULL,
                                 .finish_reason = last ? finish : CVLLM_FINISH_NONE, .stop_token_id = -1};
        cv_request_event ev = {.outputs = &d, .n_outputs = 1, .n_prompt_token_ids = r.prompts[0].n_ids, .finished = last};
        cv_api_response_apply(&resp, 0, &ev, stream ? &sse : NULL, &len, &cap);
        start = end;
    }
    if (stream) {
        cv_api_response_stream_end(&resp, &sse, &len, &cap);
        read_stream(&o, sse, cfg->reasoning_content);
    } else {
        char *s = cv_api_response_json(&resp);
        json_t *j = json_loads(s, 0, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        read_message(&o, json_object_get(ch, "message"), cfg->reasoning_content);
        snprintf(o.finish, sizeof o.finish, "%s", json_string_value(json_object_get(ch, "finish_reason")));
        json_decref(j);
        free(s);
    }
    free(sse);
    cv_api_response_free(&resp);
    cv_api_request_free(&r);
    return o;
}

typedef struct output_case {
    const cv_api_chat_config *cfg;
    const char *body;                /* chat request without the closing brace */
    const char *text;                /* what the model "generated" */
    cvllm_finish_reason finish;
    const char *reasoning, *content; /* NULL = null in the non-streaming message */
    const char *calls[2][2];         /* name, arguments */
    const char *finish_reason;
} output_case;

static bool same_calls(const chat_out *o, const output_case *k) {
    size_t n = 0;
    while (n < 2 && k->calls[n][0]) n++;
    if (o->n_calls != n) return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(o->names[i], k->calls[i][0]) || strcmp(o->args[i], k->calls[i][1])) return false;
    return true;
}

/* Non-streaming gives the expected message; streaming, cut anywhere, adds up to the same. */
static void check_output_case(const output_case *k) {
    chat_out full = run_chat(k->cfg, k->body, false, k->text, NULL, 0, k->finish);
    CHECK_MSG(full.well_formed, "%s: malformed message", k->text);
    CHECK_MSG(full.has_reasoning == (k->reasoning != NULL) && !strcmp(full.reasoning, k->reasoning ? k->reasoning : ""),
              "%s: reasoning '%s'", k->text, full.reasoning);
    CHECK_MSG(full.has_content == (k->content != NULL) && !strcmp(full.content, k->content ? k->content : ""),
              "%s: content '%s'", k->text, full.content);
    CHECK_MSG(same_calls(&full, k), "%s: %zu calls, first %s %s", k->text, full.n_calls, full.names[0], full.args[0]);
    CHECK_STR_EQ(full.finish, k->finish_reason);
    size_t n = strlen(k->text);
    size_t *every = malloc((n + 1) * sizeof *every);
    for (size_t i = 1; i < n; i++) every[i - 1] = i;
    for (size_t split = 0; split <= n; split++) {
        /* split == n: every byte its own event; else two events cut at `split` (0: one event). */
        size_t one = split;
        const size_t *cuts = split == n ? every : &one;
        size_t n_cuts = split == n ? (n ? n - 1 : 0) : split > 0;
        chat_out st = run_chat(k->cfg, k->body, true, k->text, cuts, n_cuts, k->finish);
        bool ok = st.well_formed && !strcmp(st.reasoning, full.reasoning) && !strcmp(st.content, full.content) &&
                  same_calls(&st, k) && !strcmp(st.finish, full.finish);
        CHECK_MSG(ok, "%s cut at %zu: streamed reasoning '%s' content '%s' calls %zu finish %s", k->text, split,
                  st.reasoning, st.content, st.n_calls, st.finish);
        if (!ok) break;
    }
    free(every);
}

#define CHAT_HI "{\"messages\":" USER_HI
#define CHAT_TOOLS "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL
#define HERMES_CALL(city) "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" city "\"}}\n</tool_call>"
#define CODER_CALL "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"

static void test_chat_output(void) {
    cv_api_chat_config legacy = qwen3_chat, plain = {.tmpl = qwen3_tmpl};
    legacy.reasoning_content = true;
    cv_api_chat_config c36 = {.tmpl = qwen36_tmpl, .reasoning_parser = true, .has_tool_parser = true,
                              .tool_parser = CV_TOOL_PARSER_QWEN3_CODER, .auto_tool_choice = true};
    const char *weather = "{\"city\": \"Paris\"}";
    const output_case cases[] = {
        /* Qwen3: think block, content, one hermes call; finish_reason becomes tool_calls. */
        {&qwen3_chat, CHAT_TOOLS, "<think>\nThe user wants weather.\n</think>\n\nLet me check." HERMES_CALL("Paris"),
         CVLLM_FINISH_STOP, "\nThe user wants weather.\n", "\n\nLet me check.", {{"get_weather", weather}}, "tool_calls"},
        /* Two calls; parallel_tool_calls=false keeps the first. */
        {&qwen3_chat, CHAT_TOOLS, HERMES_CALL("Paris") "\n" HERMES_CALL("Rome"), CVLLM_FINISH_STOP, NULL, NULL,
         {{"get_weather", weather}, {"get_weather", "{\"city\": \"Rome\"}"}}, "tool_calls"},
        {&qwen3_chat, CHAT_TOOLS ",\"parallel_tool_calls\":false", HERMES_CALL("Paris") "\n" HERMES_CALL("Rome"),
         CVLLM_FINISH_STOP, NULL, NULL, {{"get_weather", weather}}, "tool_calls"},
        /* A call cut off by max_tokens is still a call (vLLM reports tool_calls too). */
        {&qwen3_chat, CHAT_TOOLS, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
         CVLLM_FINISH_LENGTH, NULL, NULL, {{"get_weather", weather}}, "tool_calls"},
        /* No call: plain content and the engine's finish reason. */
        {&qwen3_chat, CHAT_TOOLS, "It is sunny <b>today</b>.", CVLLM_FINISH_LENGTH, NULL, "It is sunny <b>today</b>.",
         {{0}}, "length"},
        /* tool_choice none: the call syntax stays content. */
        {&qwen3_chat, CHAT_TOOLS ",\"tool_choice\":\"none\"", HERMES_CALL("Paris"), CVLLM_FINISH_STOP, NULL,
         HERMES_CALL("Paris"), {{0}}, "stop"},
        /* Reasoning only (cut short), reasoning hidden, the legacy field name, no parser at all. */
        {&qwen3_chat, CHAT_HI, "<think>\nStill thinking", CVLLM_FINISH_LENGTH, "\nStill thinking", NULL, {{0}}, "length"},
        {&qwen3_chat, CHAT_HI ",\"include_reasoning\":false", "<think>hidden</think>shown", CVLLM_FINISH_STOP, NULL,
         "shown", {{0}}, "stop"},
        {&legacy, CHAT_HI, "<think>why</think>because", CVLLM_FINISH_STOP, "why", "because", {{0}}, "stop"},
        {&legacy, CHAT_HI, "no reasoning here", CVLLM_FINISH_STOP, NULL, "no reasoning here", {{0}}, "stop"},
        {&plain, CHAT_HI, "<think>kept</think>as is", CVLLM_FINISH_STOP, NULL, "<think>kept</think>as is", {{0}}, "stop"},
        /* Thinking switched off in the prompt: the output is content. */
        {&qwen3_chat, CHAT_HI ",\"chat_template_kwargs\":{\"enable_thinking\":false}", "Hello!", CVLLM_FINISH_STOP,
         NULL, "Hello!", {{0}}, "stop"},
        /* Qwen3.6: the prompt opened <think>; the output closes it, then an XML tool call. */
        {&c36, CHAT_TOOLS, "The user asks for weather.\n</think>\n\n" CODER_CALL, CVLLM_FINISH_STOP,
         "The user asks for weather.\n", "\n\n", {{"get_weather", weather}}, "tool_calls"},
        /* ... or calls a tool without closing it (an implicit end of reasoning). */
        {&c36, CHAT_TOOLS, "Need the weather. " CODER_CALL, CVLLM_FINISH_STOP, "Need the weather. ", NULL,
         {{"get_weather", weather}}, "tool_calls"},
        {&c36, CHAT_HI ",\"chat_template_kwargs\":{\"enable_thinking\":false}", "Bonjour", CVLLM_FINISH_STOP, NULL,
         "Bonjour", {{0}}, "stop"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) check_output_case(&cases[i]);

    /* Text the parsers hold back still sends each token's logprobs: one entry per token. */
    const char *held = "<think>a</think>b";
    size_t cuts[] = {2, 5, 9, 12, 15};
    chat_out st = run_chat(&qwen3_chat, CHAT_HI ",\"logprobs\":true", true, held, cuts, 5, CVLLM_FINISH_STOP);
    CHECK(st.well_formed);
    CHECK_EQ_INT(st.n_logprobs, 6);
    CHECK_STR_EQ(st.reasoning, "a");
    CHECK_STR_EQ(st.content, "b");

    /* Echo puts the final assistant message's text in front of the parsed content. */
    chat_out e = run_chat(&qwen3_chat,
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hel\"}],"
                          "\"add_generation_prompt\":false,\"continue_final_message\":true,\"echo\":true",
                          false, "lo!", NULL, 0, CVLLM_FINISH_STOP);
    CHECK_STR_EQ(e.content, "Hello!");
}

/* pydantic's lax mode: what vLLM's models accept besides the exact JSON type. */
static void test_lax_fields(void) {
    cv_api_request r;
    parse_ok(CV_API_COMPLETION,
             "{\"prompt\":\"I am\",\"n\":\"2\",\"max_tokens\":\" 3 \",\"temperature\":\"0.5\",\"top_p\":1,\"stream\":\"yes\","
             "\"stream_options\":{\"include_usage\":\"true\"},\"ignore_eos\":1,\"seed\":\"-7\",\"top_k\":5.0,\"min_tokens\":true,"
             "\"skip_special_tokens\":\"off\",\"stop_token_ids\":[\"7\",8.0],\"logit_bias\":{\"12\":\"1.5\"},"
             "\"priority\":\"0\",\"frequency_penalty\":false}",
             &r, 64);
    CHECK_EQ_INT(r.params.n, 2);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 3);
    CHECK(fabsf(r.params.temperature - 0.5f) < 1e-6f && r.params.top_p == 1.0f);
    CHECK(r.stream && r.include_usage && r.params.ignore_eos && !r.params.skip_special_tokens);
    CHECK(r.params.has_seed && r.params.seed == -7);
    CHECK_EQ_INT(r.params.top_k, 5);
    CHECK_EQ_INT(r.params.min_tokens, 1);
    CHECK_EQ_INT(r.params.n_stop_token_ids, 2);
    CHECK(r.params.stop_token_ids[0] == 7 && r.params.stop_token_ids[1] == 8);
    CHECK(r.params.logit_bias_values[0] == 1.5f && r.params.frequency_penalty == 0.0f);
    cv_api_request_free(&r);
    /* A prompt of integer-looking strings is a list of strings: the member it fits exactly wins. */
    parse_ok(CV_API_COMPLETION, "{\"prompt\":[\"5\",\"6\"]}", &r, 64);
    CHECK(r.n_prompts == 2 && r.prompts[0].text && !strcmp(r.prompts[0].text, "5"));
    cv_api_request_free(&r);
    parse_ok(CV_API_COMPLETION, "{\"prompt\":[\"5\",6,true]}", &r, 64); /* lax: a list of ids */
    CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3 && r.prompts[0].ids[0] == 5 && r.prompts[0].ids[2] == 1);
    cv_api_request_free(&r);

    const cv_api_kind C = CV_API_COMPLETION;
    expect_validation(C, "{\"prompt\":\"a\",\"ignore_eos\":2}", "body.ignore_eos",
                      "1 validation error:\n  {'type': 'bool_parsing', 'loc': ('body', 'ignore_eos'), 'msg': 'Input should "
                      "be a valid boolean, unable to interpret input', 'input': 2}");
    expect_validation(C, "{\"prompt\":\"a\",\"seed\":\"-99999999999999999999\"}", "body.seed",
                      "1 validation error:\n  {'type': 'greater_than_equal', 'loc': ('body', 'seed'), 'msg': 'Input should "
                      "be greater than or equal to -9223372036854775808', 'input': '-99999999999999999999', 'ctx': {'ge': "
                      "-9223372036854775808}}");
    expect_validation(C, "{\"prompt\":\"a\",\"request_id\":null}", "body.request_id",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'request_id'), 'msg': 'Input should be "
                      "a valid string', 'input': None}");
    expect_validation(C, "{\"prompt\":\"a\",\"stream_options\":5,\"stream\":true}", "body.stream_options",
                      "1 validation error:\n  {'type': 'model_type', 'loc': ('body', 'stream_options'), 'msg': 'Input should "
                      "be a valid dictionary or instance of StreamOptions', 'input': 5, 'ctx': {'class_name': "
                      "'StreamOptions'}}");
    expect_error(C, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":\"x\"}}", 400,
                 "body.stream_options.include_usage", "'type': 'bool_parsing'");
    expect_error(C, "{\"prompt\":\"a\",\"model\":5}", 400, "body.model", "'type': 'string_type'");
    expect_error(C, "{\"prompt\":\"a\",\"temperature\":\"0x10\"}", 400, "body.temperature", "'type': 'float_parsing'");
    expect_error(C, "{\"prompt\":\"a\",\"n\":\"1_0_\"}", 400, "body.n", "'type': 'int_parsing'");
    expect_error(C, "{\"prompt\":\"a\",\"n\":\"2.5\"}", 400, "body.n", "'type': 'int_parsing'");
}

/* The vLLM fields that must work: read into the request and the engine parameters, with vLLM's
 * types and refusals (expected strings from pydantic, as in test_completion_errors). */
static void test_vllm_fields(void) {
    cv_api_request r;
    parse_ok(CV_API_COMPLETION,
             "{\"prompt\":\"I am\",\"allowed_token_ids\":[5,\"7\"],\"bad_words\":[\"house\",\"in the\"],\"priority\":-3,"
             "\"user\":\"alice\",\"vllm_xargs\":{\"a\":\"x\",\"b\":[1,\"y\",2.5],\"c\":true},\"length_penalty\":0.5,"
             "\"session_id\":\"s\",\"stream_interval\":4,\"routed_experts_prompt_start\":0,\"return_mm_kwargs\":false,"
             "\"add_special_tokens\":false,\"kv_transfer_params\":{},\"prompt_embeds\":[],\"thinking_token_budget\":-1,"
             "\"watermarking\":false}",
             &r, 64);
    CHECK_EQ_INT(r.params.n_allowed_token_ids, 2);
    CHECK(r.params.allowed_token_ids[0] == 5 && r.params.allowed_token_ids[1] == 7);
    CHECK_EQ_INT(r.params.n_bad_words, 2);
    CHECK_STR_EQ(r.params.bad_words[1], "in the");
    CHECK_EQ_INT(r.params.priority, -3);
    CHECK_STR_EQ(r.user, "alice");
    CHECK(!r.add_special_tokens);
    cvllm_sampling_params p = cv_api_prompt_params(&r, 0);
    CHECK(p.allowed_token_ids == r.allowed_token_ids && p.n_bad_words == 2 && p.priority == -3);
    cv_api_request_free(&r);
    /* Without them: no allowed ids (any token), no bad words, priority 0; add_special_tokens is true
     * for completions and false for chat, as in vLLM. */
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"I am\"}", &r, 64);
    CHECK(!r.params.allowed_token_ids && r.params.n_bad_words == 0 && r.params.priority == 0 && !r.user);
    CHECK(r.add_special_tokens && r.truncate_prompt_tokens == -2);
    cv_api_request_free(&r);
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI "}", &r, 4096);
    CHECK(!r.add_special_tokens);
    cv_api_request_free(&r);
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI ",\"add_special_tokens\":true,\"allowed_token_ids\":[]}", &r, 4096);
    CHECK(r.add_special_tokens);
    CHECK(r.params.allowed_token_ids != NULL && r.params.n_allowed_token_ids == 0); /* the engine refuses it */
    cv_api_request_free(&r);

    const cv_api_kind C = CV_API_COMPLETION;
    expect_validation(C, "{\"prompt\":\"a\",\"allowed_token_ids\":[1,\"x\"]}", "body.allowed_token_ids.1",
                      "1 validation error:\n  {'type': 'int_parsing', 'loc': ('body', 'allowed_token_ids', 1), 'msg': "
                      "'Input should be a valid integer, unable to parse string as an integer', 'input': 'x'}");
    expect_error(C, "{\"prompt\":\"a\",\"allowed_token_ids\":3}", 400, "body.allowed_token_ids", "'type': 'list_type'");
    expect_validation(C, "{\"prompt\":\"a\",\"bad_words\":[\"x\",1]}", "body.bad_words.1",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'bad_words', 1), 'msg': 'Input should "
                      "be a valid string', 'input': 1}");
    expect_error(C, "{\"prompt\":\"a\",\"bad_words\":null}", 400, "body.bad_words", "'type': 'list_type'");
    expect_validation(C, "{\"prompt\":\"a\",\"priority\":\"99999999999999999999\"}", "body.priority",
                      "1 validation error:\n  {'type': 'less_than_equal', 'loc': ('body', 'priority'), 'msg': 'Input should "
                      "be less than or equal to 9223372036854775807', 'input': '99999999999999999999', 'ctx': {'le': "
                      "9223372036854775807}}");
    expect_error(C, "{\"prompt\":\"a\",\"priority\":4294967296}", 400, "priority", "out of range");
    expect_validation(C, "{\"prompt\":\"a\",\"user\":5}", "body.user",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'user'), 'msg': 'Input should be a "
                      "valid string', 'input': 5}");
    expect_validation(C, "{\"prompt\":\"a\",\"length_penalty\":null}", "body.length_penalty",
                      "1 validation error:\n  {'type': 'float_type', 'loc': ('body', 'length_penalty'), 'msg': 'Input "
                      "should be a valid number', 'input': None}");
    expect_validation(C, "{\"prompt\":\"a\",\"add_special_tokens\":\"maybe\"}", "body.add_special_tokens",
                      "1 validation error:\n  {'type': 'bool_parsing', 'loc': ('body', 'add_special_tokens'), 'msg': 'Input "
                      "should be a valid boolean, unable to interpret input', 'input': 'maybe'}");
    expect_validation(C, "{\"prompt\":\"a\",\"vllm_xargs\":{\"k\":{\"b\":1}}}", "body.vllm_xargs.k",
                      "4 validation errors:\n"
                      "  {'type': 'string_type', 'loc': ('body', 'vllm_xargs', 'k', 'str'), 'msg': 'Input should be a valid string', 'input': {'b': 1}}\n"
                      "  {'type': 'int_type', 'loc': ('body', 'vllm_xargs', 'k', 'int'), 'msg': 'Input should be a valid integer', 'input': {'b': 1}}\n"
                      "  {'type': 'float_type', 'loc': ('body', 'vllm_xargs', 'k', 'float'), 'msg': 'Input should be a valid number', 'input': {'b': 1}}\n"
                      "  {'type': 'list_type', 'loc': ('body', 'vllm_xargs', 'k', 'list[union[str,int,float]]'), 'msg': 'Input should be a valid list', 'input': {'b': 1}}");
    expect_validation(C, "{\"prompt\":\"a\",\"vllm_xargs\":{\"k\":[1,null]}}", "body.vllm_xargs.k",
                      "6 validation errors:\n"
                      "  {'type': 'string_type', 'loc': ('body', 'vllm_xargs', 'k', 'str'), 'msg': 'Input should be a valid string', 'input': [1, None]}\n"
                      "  {'type': 'int_type', 'loc': ('body', 'vllm_xargs', 'k', 'int'), 'msg': 'Input should be a valid integer', 'input': [1, None]}\n"
                      "  {'type': 'float_type', 'loc': ('body', 'vllm_xargs', 'k', 'float'), 'msg': 'Input should be a valid number', 'input': [1, None]}\n"
                      "  {'type': 'string_type', 'loc': ('body', 'vllm_xargs', 'k', 'list[union[str,int,float]]', 1, 'str'), 'msg': 'Input should be a valid string', 'input': None}\n"
                      "  {'type': 'int_type', 'loc': ('body', 'vllm_xargs', 'k', 'list[union[str,int,float]]', 1, 'int'), 'msg': 'Input should be a valid integer', 'input': None}\n"
                      "  {'type': 'float_type', 'loc': ('body', 'vllm_xargs', 'k', 'list[union[str,int,float]]', 1, 'float'), 'msg': 'Input should be a valid number', 'input': None}");
    expect_error(C, "{\"prompt\":\"a\",\"vllm_xargs\":[1]}", 400, "body.vllm_xargs", "'type': 'dict_type'");
    expect_error(C, "{\"prompt\":\"a\",\"session_id\":1}", 400, "body.session_id", "'type': 'string_type'");
    expect_error(C, "{\"prompt\":\"a\",\"stream_interval\":0}", 400, "body.stream_interval", "'type': 'greater_than_equal'");
    expect_error(C, "{\"prompt\":\"a\",\"routed_experts_prompt_start\":-1}", 400, "body.routed_experts_prompt_start",
                 "Input should be greater than or equal to 0");

    /* vLLM's before-validators, wrapped as value_errors on the body and naming their parameter. */
    expect_validation(C, "{\"prompt\":\"a\",\"cache_salt\":\"\"}", "cache_salt",
                      "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': \"Value error, Parameter "
                      "'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)\", 'input': {'prompt': "
                      "'a', 'cache_salt': ''}, 'ctx': {'error': VLLMValidationError(\"Parameter 'cache_salt' must be a "
                      "non-empty string if provided.\")}}");
    expect_error(C, "{\"prompt\":\"a\",\"cache_salt\":\"a/b\"}", 400, "cache_salt",
                 "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\\\\\', or NUL.");
    expect_error(C, "{\"prompt\":\"a\",\"cache_salt\":5}", 400, "cache_salt", "must be a non-empty string");
    char salt[200];
    snprintf(salt, sizeof salt, "{\"prompt\":\"a\",\"cache_salt\":\"%0129d\"}", 0);
    expect_error(C, salt, 400, "cache_salt", "must be at most 128 characters");
    expect_error(C, "{\"prompt\":\"a\",\"prompt_logprobs\":\"2\"}", 400, "prompt_logprobs",
                 "`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value=2)");
    expect_error(C, "{\"prompt\":\"a\",\"prompt_logprobs\":-2}", 400, "prompt_logprobs",
                 "`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value=-2)");
    /* -1 asks for the whole vocabulary (the engine's max_logprobs check refuses it in vLLM's words);
     * prompt_logprobs 0 streams; an empty stream_options is no stream option at all. */
    parse_ok(C, "{\"prompt\":\"I am\",\"prompt_logprobs\":-1,\"logprobs\":-1}", &r, 64);
    CHECK(r.prompt_logprobs == SMALL_VOCAB && r.params.logprobs == SMALL_VOCAB);
    cv_api_request_free(&r);
    parse_ok(C, "{\"prompt\":\"I am\",\"prompt_logprobs\":0,\"stream\":true,\"stream_options\":{}}", &r, 64);
    CHECK(r.prompt_logprobs == 0 && r.stream);
    cv_api_request_free(&r);
    parse_ok(C, "{\"prompt\":\"I am\",\"stream_options\":{}}", &r, 64);
    cv_api_request_free(&r);

    /* vLLM's before-validators run before any field is validated: their error wins. */
    expect_error(C, "{\"prompt\":3,\"n\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
                 "Stream options can only be defined when `stream=True`.");
    expect_error(CV_API_CHAT, "{\"messages\":5,\"cache_salt\":\"\"}", 400, "cache_salt", "non-empty string");

    /* Fields whose effect this backend lacks are refused, not dropped. */
    expect_error(C, "{\"prompt\":\"a\",\"prompt_embeds\":\"AAAA\"}", 400, "",
                 "You must set `--enable-prompt-embeds` to input `prompt_embeds`.");
    expect_error(C, "{\"prompt_embeds\":[\"AAAA\"]}", 400, "", "--enable-prompt-embeds");
    expect_error(C, "{\"prompt\":\"a\",\"prompt_embeds\":5}", 400, "body.prompt_embeds", "'type': 'bytes_type'");
    expect_error(C, "{\"prompt\":\"a\",\"kv_transfer_params\":{\"do_remote_decode\":true}}", 400, "kv_transfer_params",
                 "KV transfer connector");
    expect_error(C, "{\"prompt\":\"a\",\"kv_transfer_params\":[1]}", 400, "body.kv_transfer_params", "'type': 'dict_type'");
    expect_error(C, "{\"prompt\":\"a\",\"ec_transfer_params\":{\"x\":1}}", 400, "ec_transfer_params", "transfer connector");
    expect_error(C, "{\"prompt\":\"a\",\"logprobs\":1,\"logprob_token_ids\":[3]}", 400, "logprob_token_ids", "not supported");
    expect_error(C, "{\"prompt\":\"a\",\"logprobs\":1,\"logprob_token_ids\":[]}", 400, "logprob_token_ids",
                 "`logprob_token_ids` must not be an empty list.");
    expect_error(C, "{\"prompt\":\"a\",\"logprob_token_ids\":[3]}", 400, "logprob_token_ids",
                 "when using `logprob_token_ids`, `logprobs` must be set. (parameter=logprob_token_ids)");
    expect_error(C, "{\"prompt\":\"a\",\"repetition_detection\":{\"max_pattern_size\":4}}", 400, "repetition_detection", "not supported");
    expect_error(C, "{\"prompt\":\"a\",\"thinking_token_budget\":10}", 400, "thinking_token_budget", "not supported");
    expect_error(C, "{\"prompt\":\"a\",\"thinking_token_budget\":\"x\"}", 400, "body.thinking_token_budget", "int_parsing");
    expect_error(C, "{\"prompt\":\"a\",\"watermarking\":true}", 400, "watermarking", "not supported");
    expect_error(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"logprob_token_ids\":[3]}", 400,
                 "logprob_token_ids", "not supported");
    expect_error(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprob_token_ids\":[3]}", 400,
                 "logprob_token_ids", "`logprobs` must be set to true.");
}

/* truncate_prompt_tokens keeps the last K prompt tokens (the first with truncation_side "right"); -1
 * keeps max_model_len - max_tokens; a K beyond that is vLLM's TokenizeParams error. */
static void test_truncate_prompt_tokens(void) {
    cv_api_request full, r;
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"I am in the house\",\"max_tokens\":4}", &full, 64);
    CHECK_EQ_INT(full.prompts[0].n_ids, 5);
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"I am in the house\",\"max_tokens\":4,\"truncate_prompt_tokens\":3}", &r, 64);
    CHECK_EQ_INT(r.prompts[0].n_ids, 3);
    CHECK(!memcmp(r.prompts[0].ids, full.prompts[0].ids + 2, 3 * sizeof(int32_t)));
    CHECK_STR_EQ(r.prompts[0].text, "I am in the house"); /* echo sends the text as given, as vLLM does */
    cv_api_request_free(&r);
    parse_ok(CV_API_COMPLETION,
             "{\"prompt\":\"I am in the house\",\"max_tokens\":4,\"truncate_prompt_tokens\":\"2\",\"truncation_side\":\"right\"}", &r, 64);
    CHECK_EQ_INT(r.prompts[0].n_ids, 2);
    CHECK(!memcmp(r.prompts[0].ids, full.prompts[0].ids, 2 * sizeof(int32_t)));
    cv_api_request_free(&r);
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"I am in the house\",\"truncate_prompt_tokens\":9,\"truncation_side\":null}", &r, 64);
    CHECK_EQ_INT(r.prompts[0].n_ids, 5); /* shorter than K: untouched */
    cv_api_request_free(&r);
    cv_api_request_free(&full);

    /* -1 on 70 ids with max_tokens 4 and a 64-token context: the last 60 stay. */
    char body[512];
    char *w = body + sprintf(body, "{\"max_tokens\":4,\"truncate_prompt_tokens\":-1,\"prompt\":[1");
    for (int i = 2; i <= 70; i++) w += sprintf(w, ",%d", i);
    strcpy(w, "]}");
    parse_ok(CV_API_COMPLETION, body, &r, 64);
    CHECK_EQ_INT(r.prompts[0].n_ids, 60);
    CHECK(r.prompts[0].ids[0] == 11 && r.prompts[0].ids[59] == 70);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 4);
    cv_api_request_free(&r);
    /* Token-id prompts in a list are each truncated. */
    parse_ok(CV_API_COMPLETION, "{\"prompt\":[[1,2,3],[4,5]],\"truncate_prompt_tokens\":2}", &r, 64);
    CHECK(r.prompts[0].n_ids == 2 && r.prompts[0].ids[0] == 2 && r.prompts[1].n_ids == 2);
    cv_api_request_free(&r);
    /* Chat: the rendered conversation is truncated too. */
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI ",\"truncate_prompt_tokens\":4}", &r, 4096);
    CHECK_EQ_INT(r.prompts[0].n_ids, 4);
    CHECK_EQ_INT(r.prompts[0].max_tokens, 4096 - 4);
    cv_api_request_free(&r);

    const cv_api_kind C = CV_API_COMPLETION;
    expect_error(C, "{\"prompt\":\"I am\",\"max_tokens\":4,\"truncate_prompt_tokens\":61}", 400, "truncate_prompt_tokens",
                 "truncate_prompt_tokens=61 cannot be greater than max_model_len - max_tokens = 60. Please request a smaller "
                 "truncation size. (parameter=truncate_prompt_tokens, value=61)");
    expect_error(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":10,\"truncate_prompt_tokens\":60}",
                 400, "truncate_prompt_tokens", "cannot be greater than max_model_len - max_completion_tokens = 54.");
    expect_error(C, "{\"prompt\":\"I am\",\"truncate_prompt_tokens\":0}", 400, "prompt", "The decoder prompt cannot be empty");
    expect_validation(C, "{\"prompt\":\"a\",\"truncate_prompt_tokens\":-2}", "body.truncate_prompt_tokens",
                      "1 validation error:\n  {'type': 'greater_than_equal', 'loc': ('body', 'truncate_prompt_tokens'), "
                      "'msg': 'Input should be greater than or equal to -1', 'input': -2, 'ctx': {'ge': -1}}");
    expect_error(C, "{\"prompt\":\"a\",\"truncate_prompt_tokens\":1.5}", 400, "body.truncate_prompt_tokens", "int_from_float");
    expect_validation(C, "{\"prompt\":\"a\",\"truncation_side\":\"middle\"}", "body.truncation_side",
                      "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'truncation_side'), 'msg': \"Input "
                      "should be 'left' or 'right'\", 'input': 'middle', 'ctx': {'expected': \"'left' or 'right'\"}}");
}

/* return_prompt_text: the rendered prompt, in the reply and on the stream's first chunk. */
static void test_return_prompt_text(void) {
    for (int stream = 0; stream < 2; stream++) {
        cv_api_request r;
        parse_ok(CV_API_CHAT,
                 stream ? "{\"messages\":" USER_HI ",\"return_prompt_text\":true,\"stream\":true}"
                        : "{\"messages\":" USER_HI ",\"return_prompt_text\":true}",
                 &r, 4096);
        CHECK(r.return_prompt_text);
        cv_api_response resp;
        cv_api_response_init(&resp, &r, tok, "qwen3", false);
        int32_t id = 40;
        cv_completion_delta d[] = {delta(0, &id, 1, "I", CVLLM_FINISH_LENGTH, NULL)};
        cv_request_event ev = {.outputs = d, .n_outputs = 1, .n_prompt_token_ids = r.prompts[0].n_ids, .finished = true};
        char *sse = NULL;
        size_t len = 0, cap = 0;
        cv_api_response_apply(&resp, 0, &ev, stream ? &sse : NULL, &len, &cap);
        if (stream) {
            cv_api_response_stream_end(&resp, &sse, &len, &cap);
            char events[8][2048];
            size_t n = sse_events(sse, events, 8);
            CHECK(n >= 3);
            json_t *first = parse_json(events[0]), *second = parse_json(events[1]);
            CHECK_STR_EQ(json_string_value(json_object_get(first, "prompt_text")), r.prompts[0].text);
            CHECK(json_object_get(second, "prompt_text") == NULL);
            json_decref(first);
            json_decref(second);
            free(sse);
        } else {
            char *body = cv_api_response_json(&resp);
            json_t *j = parse_json(body);
            CHECK_STR_EQ(json_string_value(json_object_get(j, "prompt_text")), r.prompts[0].text);
            json_decref(j);
            free(body);
        }
        cv_api_response_free(&resp);
        cv_api_request_free(&r);
    }
    cv_api_request r;
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI "}", &r, 4096);
    cv_api_response resp;
    cv_api_response_init(&resp, &r, tok, "qwen3", false);
    char *body = cv_api_response_json(&resp);
    json_t *j = parse_json(body);
    CHECK(json_is_null(json_object_get(j, "prompt_text")));
    json_decref(j);
    free(body);
    cv_api_response_free(&resp);
    cv_api_request_free(&r);
}


/* The text as prometheus_client prints it: counters' HELP/TYPE with `_total`, labels sorted by name
 * (`le` between engine and model_name), numbers as floatToGoString, vLLM's 1-2-5 size buckets, and
 * the instrumentator's http_* families. */
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
    double sizes[CV_HISTOGRAM_MAX_BUCKETS];
    size_t n_sizes = cv_histogram_1_2_5_bounds(4096, sizes, CV_HISTOGRAM_MAX_BUCKETS);
    CHECK_EQ_INT(n_sizes, 11); /* 1, 2, 5, ..., 1000, 2000 */
    CHECK(sizes[0] == 1 && sizes[2] == 5 && sizes[10] == 2000);
    cv_histogram_init(&st.request_prompt_tokens, sizes, n_sizes);
    cv_histogram_observe(&st.request_prompt_tokens, 1234567);
    cv_http_metrics *http = cv_http_metrics_create();
    char *t = cv_metrics_render(&st, 1, "q\"3", NULL, 0, http);
    const char *L = "{engine=\"0\",model_name=\"q\\\"3\"}";
    char line[256];
    snprintf(line, sizeof line, "vllm:num_requests_running%s 2.0\n", L);
    CHECK_CONTAINS(t, line);
    snprintf(line, sizeof line, "vllm:kv_cache_usage_perc%s 0.25\n", L);
    CHECK_CONTAINS(t, line);
    snprintf(line, sizeof line, "vllm:prompt_tokens_total%s 10.0\n", L);
    CHECK_CONTAINS(t, line);
    CHECK_CONTAINS(t, "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n"
                      "# TYPE vllm:prefix_cache_hits_total counter\n");
    CHECK_CONTAINS(t, "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"q\\\"3\"} 2.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"q\\\"3\"} 1.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"1.0\",model_name=\"q\\\"3\"} 2.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"q\\\"3\"} 3.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"q\\\"3\"} 3.0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"q\\\"3\"} 5.55\n");
    CHECK_CONTAINS(t, "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"2000.0\",model_name=\"q\\\"3\"} 0.0\n");
    CHECK_CONTAINS(t, "vllm:request_prompt_tokens_sum{engine=\"0\",model_name=\"q\\\"3\"} 1.234567e+06\n");
    CHECK_CONTAINS(t, "# HELP vllm:request_time_per_output_token_seconds Histogram of time_per_output_token_seconds per "
                      "request.\n# TYPE vllm:request_time_per_output_token_seconds histogram\n");
    CHECK_CONTAINS(t, "# TYPE vllm:e2e_request_latency_seconds histogram\n");
    CHECK_CONTAINS(t, "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"64\"} 1.0\n");
    CHECK(!strstr(t, "spec_decode")); /* only when speculative decoding is on */
    /* A labelled family without children yet prints its header only, as prometheus_client does. */
    CHECK_CONTAINS(t, "# TYPE http_requests_total counter\n# HELP http_request_duration_highr_seconds");
    CHECK_CONTAINS(t, "http_request_duration_highr_seconds_bucket{le=\"60.0\"} 0.0\n");
    CHECK_CONTAINS(t, "http_request_duration_highr_seconds_count 0.0\n");
    CHECK_CONTAINS(t, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ");
    free(t);

    /* The instrumentator's labels: status classes, a missing response counting as 5xx, durations. */
    CHECK_STR_EQ(cv_http_metrics_handler("/v1/completions", "/v1/completions"), "/v1/completions");
    CHECK_STR_EQ(cv_http_metrics_handler(NULL, "/v1/nope"), "none");
    CHECK(cv_http_metrics_handler("/metrics", "/metrics") == NULL);
    CHECK(cv_http_metrics_handler(NULL, "/healthz") == NULL); /* its patterns match anywhere */
    const char *none = cv_http_metrics_handler(NULL, "/x");
    cv_http_metrics_observe(http, "/v1/completions", "POST", 200, 0.25);
    cv_http_metrics_observe(http, "/v1/completions", "POST", 201, 2.0);
    cv_http_metrics_observe(http, "/v1/completions", "POST", 400, 0.0625);
    cv_http_metrics_observe(http, none, "GET", 404, 0.001);
    cv_http_metrics_observe(http, none, "GET", 0, 0.002);
    t = cv_metrics_render(&st, 1, "q", NULL, 0, http);
    CHECK_CONTAINS(t, "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"2xx\"} 2.0\n");
    CHECK_CONTAINS(t, "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"4xx\"} 1.0\n");
    CHECK_CONTAINS(t, "http_requests_total{handler=\"none\",method=\"GET\",status=\"4xx\"} 1.0\n");
    CHECK_CONTAINS(t, "http_requests_total{handler=\"none\",method=\"GET\",status=\"5xx\"} 1.0\n");
    CHECK_CONTAINS(t, "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"0.1\",method=\"POST\"} 1.0\n"
                      "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"0.5\",method=\"POST\"} 2.0\n"
                      "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"1.0\",method=\"POST\"} 2.0\n"
                      "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"+Inf\",method=\"POST\"} 3.0\n"
                      "http_request_duration_seconds_count{handler=\"/v1/completions\",method=\"POST\"} 3.0\n"
                      "http_request_duration_seconds_sum{handler=\"/v1/completions\",method=\"POST\"} 2.3125\n");
    CHECK_CONTAINS(t, "http_request_duration_highr_seconds_bucket{le=\"0.01\"} 2.0\n");
    CHECK_CONTAINS(t, "http_request_duration_highr_seconds_count 5.0\n");
    free(t);
    cv_http_metrics_free(http);

    st.spec_num_positions = 2;
    st.spec_num_drafts = 5;
    st.spec_num_draft_tokens = 10;
    st.spec_num_accepted_tokens = 4;
    st.spec_accepted_per_pos[0] = 3;
    st.spec_accepted_per_pos[1] = 1;
    http = cv_http_metrics_create();
    t = cv_metrics_render(&st, 1, "q", NULL, 0, http);
    CHECK_CONTAINS(t, "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"q\"} 5.0\n");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"q\"} 10.0\n");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"q\"} 4.0\n");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"q\",position=\"1\"} 1.0\n");
    CHECK(strstr(t, "lora_requests_info") == NULL); /* LoRA off */
    free(t);

    /* LoRA: the adapters running and waiting across two engines, in slot order, escaped; a slot freed
     * since the engines' reading (no name) is left out */
    cv_engine_stats two[2] = {st, st};
    two[0].max_loras = two[1].max_loras = 2;
    two[0].lora_state[0] = 1;     /* a runs on engine 0 */
    two[1].lora_state[1] = 2;     /* b"x waits on engine 1 */
    two[1].lora_state[2] = 1 | 2; /* c runs and waits there */
    two[0].lora_state[3] = 1;     /* its slot was freed */
    const char *const names[] = {"a", "b\"x", "c", NULL};
    t = cv_metrics_render(two, 2, "q", names, 4, http);
    CHECK_CONTAINS(t, "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
                      "# TYPE vllm:lora_requests_info gauge\n"
                      "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"b\\\"x,c\",running_lora_adapters=\"a,c\"} ");
    free(t);
    cv_http_metrics_free(http);
}


/* ---- structured outputs ---------------------------------------------------------------------------- */

static const char REQUIRED_WEATHER_SCHEMA[] =
    "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"anyOf\":[{\"properties\":{\"name\":{\"type\":"
    "\"string\",\"enum\":[\"get_weather\"]},\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\"}},\"required\":[\"city\"]}},\"required\":[\"name\",\"parameters\"]}]}}";

/* Parses a chat (`messages` in body) or completion request with the Qwen3 recipe and `so` as the
 * server's structured-output defaults, and prepares it. */
static bool parse_structured(const char *body, const cv_api_structured_config *so, cv_api_request *r) {
    bool chat = strstr(body, "\"messages\"") != NULL;
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    if (so) l.structured = *so;
    cv_api_error err = {0};
    int rc = chat ? cv_api_parse_chat(body, strlen(body), &l, r, &err) : cv_api_parse_completion(body, strlen(body), &l, r, &err);
    if (rc == 0) rc = cv_api_prepare(r, tok, &l, &err);
    CHECK_MSG(rc == 0, "%s: %s", body, err.message);
    return rc == 0;
}

/* The constraint of `body`: its kind and spec (a JSON spec compared as JSON). */
static void expect_constraint(const char *body, cvllm_constraint_kind kind, const char *spec) {
    cv_api_request r;
    if (!parse_structured(body, NULL, &r)) {
        cv_api_request_free(&r);
        return;
    }
    CHECK_MSG(r.has_constraint && r.constraint.kind == kind, "%s: kind %d", body, r.has_constraint ? (int)r.constraint.kind : 0);
    if (kind == CVLLM_CONSTRAINT_JSON && spec) {
        json_t *want = json_loads(spec, 0, NULL), *got = r.constraint.spec ? json_loads(r.constraint.spec, 0, NULL) : NULL;
        CHECK_MSG(json_equal(want, got), "%s: spec %s", body, r.constraint.spec);
        json_decref(want);
        json_decref(got);
    } else if (spec) {
        CHECK_STR_EQ(r.constraint.spec, spec);
    }
    CHECK(cv_api_prompt_params(&r, 0).grammar == NULL); /* the server compiles it */
    cv_api_request_free(&r);
}

static void expect_no_constraint(const char *body) {
    cv_api_request r;
    if (parse_structured(body, NULL, &r)) CHECK_MSG(!r.has_constraint, "%s: constrained", body);
    cv_api_request_free(&r);
}

#define CHAT_FORCED(choice) "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":" choice

static void test_structured_fields(void) {
    const cv_api_kind C = CV_API_COMPLETION;
    /* response_format, on completions and chat. */
    expect_no_constraint("{\"prompt\":\"a\",\"response_format\":{\"type\":\"text\"}}");
    expect_constraint("{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"}}", CVLLM_CONSTRAINT_JSON_OBJECT, NULL);
    expect_constraint("{\"messages\":" USER_HI ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                      "\"description\":\"d\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                      "\"integer\"}}}}}}",
                      CVLLM_CONSTRAINT_JSON, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    /* structured_outputs: each constraint, the schema as an object or as JSON text. */
    expect_constraint("{\"prompt\":\"a\",\"structured_outputs\":{\"json\":{\"type\":\"string\"}}}", CVLLM_CONSTRAINT_JSON,
                      "{\"type\":\"string\"}");
    expect_constraint("{\"prompt\":\"a\",\"structured_outputs\":{\"json\":\"{\\\"type\\\": \\\"string\\\"}\"}}",
                      CVLLM_CONSTRAINT_JSON, "{\"type\": \"string\"}");
    expect_constraint("{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"[a-z]+\\\\d\"}}", CVLLM_CONSTRAINT_REGEX, "[a-z]+\\d");
    expect_constraint("{\"prompt\":\"a\",\"structured_outputs\":{\"grammar\":\"root ::= \\\"yes\\\"\"}}", CVLLM_CONSTRAINT_GRAMMAR,
                      "root ::= \"yes\"");
    expect_constraint("{\"prompt\":\"a\",\"structured_outputs\":{\"json_object\":true,\"disable_fallback\":true}}",
                      CVLLM_CONSTRAINT_JSON_OBJECT, NULL);
    cv_api_request r;
    if (parse_structured("{\"prompt\":\"a\",\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]}}", NULL, &r)) {
        CHECK(r.has_constraint && r.constraint.kind == CVLLM_CONSTRAINT_CHOICE && r.constraint.n_choices == 2);
        CHECK_STR_EQ(r.constraint.choices[1], "no");
        CHECK(!r.constraint.disable_any_whitespace && !r.constraint.whitespace_pattern);
    }
    cv_api_request_free(&r);
    /* The options; the server's defaults (--structured-outputs-config) are or'ed in, its whitespace
     * pattern applies when the request has none. */
    cv_api_structured_config defaults = {.disable_additional_properties = true, .whitespace_pattern = "[ ]?"};
    if (parse_structured("{\"prompt\":\"a\",\"structured_outputs\":{\"json\":{},\"disable_any_whitespace\":\"yes\","
                         "\"whitespace_pattern\":\"\\\\s*\"}}", &defaults, &r)) {
        CHECK(r.constraint.disable_any_whitespace && r.constraint.disable_additional_properties);
        CHECK_STR_EQ(r.constraint.whitespace_pattern, "\\s*");
    }
    cv_api_request_free(&r);
    if (parse_structured("{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"}}", &defaults, &r)) {
        CHECK(!r.constraint.disable_any_whitespace && r.constraint.disable_additional_properties);
        CHECK_STR_EQ(r.constraint.whitespace_pattern, "[ ]?");
    }
    cv_api_request_free(&r);
    /* response_format merges into structured_outputs, keeping its options (vLLM's replace()). */
    if (parse_structured("{\"prompt\":\"a\",\"structured_outputs\":{\"json\":{\"type\":\"integer\"},\"disable_any_whitespace\":"
                         "true},\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{"
                         "\"type\":\"boolean\"}}}}", NULL, &r)) {
        CHECK(r.constraint.kind == CVLLM_CONSTRAINT_JSON && r.constraint.disable_any_whitespace);
        CHECK_STR_EQ(r.constraint.spec, "{\"type\":\"boolean\"}");
    }
    cv_api_request_free(&r);
    expect_error(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a\"},\"response_format\":{\"type\":\"json_object\"}}", 400, "",
                 "You can only use one kind of structured outputs constraint but multiple are specified: {'json': None, "
                 "'regex': 'a', 'choice': None, 'grammar': None, 'json_object': True, 'disable_any_whitespace': False, "
                 "'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None}");
    /* A json_schema format without a schema names no constraint. */
    expect_error(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}", 400, "",
                 "You must use one kind of structured outputs constraint but none are specified: {'json': None, 'regex': "
                 "None, 'choice': None, 'grammar': None, 'json_object': None, 'disable_any_whitespace': False, "
                 "'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None}");
    expect_error(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"json_object\":false}}", 400, "",
                 "No valid structured output parameter found");
    /* The before-validators. */
    expect_validation(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\"}}", "response_format",
                      "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': \"Value error, When "
                      "response_format type is 'json_schema', the 'json_schema' field must be provided. "
                      "(parameter=response_format)\", 'input': {'prompt': 'a', 'response_format': {'type': 'json_schema'}}, "
                      "'ctx': {'error': VLLMValidationError(\"When response_format type is 'json_schema', the 'json_schema' "
                      "field must be provided.\")}}");
    expect_error(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"json\":{},\"choice\":[\"x\"]}}", 400, "structured_outputs",
                 "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice'). "
                 "(parameter=structured_outputs)");
    /* structural tags: a response_format of either spelling becomes structural_tag, the JSON text of the
     * format as its model dumps it (extra keys dropped, a missing schema null); structured_outputs
     * passes its text on as is */
    expect_constraint("{\"prompt\":\"a\",\"response_format\":{\"type\":\"structural_tag\",\"format\":{\"type\":"
                      "\"const_string\",\"value\":\"x\"},\"extra\":1}}", CVLLM_CONSTRAINT_STRUCTURAL_TAG,
                      "{\"type\":\"structural_tag\",\"format\":{\"type\":\"const_string\",\"value\":\"x\"}}");
    expect_constraint("{\"messages\":" USER_HI ",\"response_format\":{\"type\":\"structural_tag\",\"structures\":[{\"begin\":"
                      "\"<f>\",\"end\":\"</f>\"}],\"triggers\":[\"<f\"]}}", CVLLM_CONSTRAINT_STRUCTURAL_TAG,
                      "{\"type\":\"structural_tag\",\"structures\":[{\"begin\":\"<f>\",\"schema\":null,\"end\":\"</f>\"}],"
                      "\"triggers\":[\"<f\"]}");
    expect_constraint("{\"messages\":" USER_HI ",\"structured_outputs\":{\"structural_tag\":\"{}\"}}",
                      CVLLM_CONSTRAINT_STRUCTURAL_TAG, "{}");
    expect_error(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"structural_tag\",\"format\":{}},"
                    "\"structured_outputs\":{\"regex\":\"a\"}}", 400, "",
                 "You can only use one kind of structured outputs constraint but multiple are specified");
    /* Field validation: pydantic's errors for the response_format union and the dataclass (the expected
     * strings are pydantic 2.13's for the same field types). */
    expect_validation(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"yaml\"}}", "body.response_format.ResponseFormat.type",
                      "6 validation errors:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'ResponseFormat', 'type'), 'msg': \"Input should be 'text', 'json_object' or 'json_schema'\", 'input': 'yaml', 'ctx': {'expected': \"'text', 'json_object' or 'json_schema'\"}}\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'type'), 'msg': \"Input should be 'structural_tag'\", 'input': 'yaml', 'ctx': {'expected': \"'structural_tag'\"}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'format'), 'msg': 'Field required', 'input': {'type': 'yaml'}}\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'type'), 'msg': \"Input should be 'structural_tag'\", 'input': 'yaml', 'ctx': {'expected': \"'structural_tag'\"}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'structures'), 'msg': 'Field required', 'input': {'type': 'yaml'}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'triggers'), 'msg': 'Field required', 'input': {'type': 'yaml'}}");
    expect_validation(C, "{\"prompt\":\"a\",\"response_format\":\"text\"}", "body.response_format.ResponseFormat",
                      "3 validation errors:\n  {'type': 'model_type', 'loc': ('body', 'response_format', 'ResponseFormat'), 'msg': 'Input should be a valid dictionary or instance of ResponseFormat', 'input': 'text', 'ctx': {'class_name': 'ResponseFormat'}}\n  {'type': 'model_type', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat'), 'msg': 'Input should be a valid dictionary or instance of StructuralTagResponseFormat', 'input': 'text', 'ctx': {'class_name': 'StructuralTagResponseFormat'}}\n  {'type': 'model_type', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat'), 'msg': 'Input should be a valid dictionary or instance of LegacyStructuralTagResponseFormat', 'input': 'text', 'ctx': {'class_name': 'LegacyStructuralTagResponseFormat'}}");
    expect_validation(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":5,\"strict\":\"maybe\"}}}",
                      "body.response_format.ResponseFormat.json_schema.schema",
                      "7 validation errors:\n  {'type': 'dict_type', 'loc': ('body', 'response_format', 'ResponseFormat', 'json_schema', 'schema'), 'msg': 'Input should be a valid dictionary', 'input': 5}\n  {'type': 'bool_parsing', 'loc': ('body', 'response_format', 'ResponseFormat', 'json_schema', 'strict'), 'msg': 'Input should be a valid boolean, unable to interpret input', 'input': 'maybe'}\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'type'), 'msg': \"Input should be 'structural_tag'\", 'input': 'json_schema', 'ctx': {'expected': \"'structural_tag'\"}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'format'), 'msg': 'Field required', 'input': {'type': 'json_schema', 'json_schema': {'name': 'n', 'schema': 5, 'strict': 'maybe'}}}\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'type'), 'msg': \"Input should be 'structural_tag'\", 'input': 'json_schema', 'ctx': {'expected': \"'structural_tag'\"}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'structures'), 'msg': 'Field required', 'input': {'type': 'json_schema', 'json_schema': {'name': 'n', 'schema': 5, 'strict': 'maybe'}}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'triggers'), 'msg': 'Field required', 'input': {'type': 'json_schema', 'json_schema': {'name': 'n', 'schema': 5, 'strict': 'maybe'}}}");
    expect_validation(C, "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":5}}",
                      "body.response_format.ResponseFormat.json_schema",
                      "6 validation errors:\n  {'type': 'model_type', 'loc': ('body', 'response_format', 'ResponseFormat', 'json_schema'), 'msg': 'Input should be a valid dictionary or instance of JsonSchemaResponseFormat', 'input': 5, 'ctx': {'class_name': 'JsonSchemaResponseFormat'}}\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'type'), 'msg': \"Input should be 'structural_tag'\", 'input': 'json_schema', 'ctx': {'expected': \"'structural_tag'\"}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'format'), 'msg': 'Field required', 'input': {'type': 'json_schema', 'json_schema': 5}}\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'type'), 'msg': \"Input should be 'structural_tag'\", 'input': 'json_schema', 'ctx': {'expected': \"'structural_tag'\"}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'structures'), 'msg': 'Field required', 'input': {'type': 'json_schema', 'json_schema': 5}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'triggers'), 'msg': 'Field required', 'input': {'type': 'json_schema', 'json_schema': 5}}");
    expect_validation(C, "{\"prompt\":\"a\",\"response_format\":{\"structures\":[{\"begin\":1}],\"triggers\":[\"a\",2]}}",
                      "body.response_format.ResponseFormat.type",
                      "7 validation errors:\n  {'type': 'missing', 'loc': ('body', 'response_format', 'ResponseFormat', 'type'), 'msg': 'Field required', 'input': {'structures': [{'begin': 1}], 'triggers': ['a', 2]}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'type'), 'msg': 'Field required', 'input': {'structures': [{'begin': 1}], 'triggers': ['a', 2]}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'StructuralTagResponseFormat', 'format'), 'msg': 'Field required', 'input': {'structures': [{'begin': 1}], 'triggers': ['a', 2]}}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'type'), 'msg': 'Field required', 'input': {'structures': [{'begin': 1}], 'triggers': ['a', 2]}}\n  {'type': 'string_type', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'structures', 0, 'begin'), 'msg': 'Input should be a valid string', 'input': 1}\n  {'type': 'missing', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'structures', 0, 'end'), 'msg': 'Field required', 'input': {'begin': 1}}\n  {'type': 'string_type', 'loc': ('body', 'response_format', 'LegacyStructuralTagResponseFormat', 'triggers', 1), 'msg': 'Input should be a valid string', 'input': 2}");
    expect_validation(C, "{\"prompt\":\"a\",\"structured_outputs\":\"x\"}", "body.structured_outputs",
                      "1 validation error:\n  {'type': 'dataclass_type', 'loc': ('body', 'structured_outputs'), 'msg': 'Input should be a dictionary or an instance of StructuredOutputsParams', 'input': 'x', 'ctx': {'class_name': 'StructuredOutputsParams'}}");
    expect_validation(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"json\":5}}", "body.structured_outputs.json",
                      "2 validation errors:\n  {'type': 'string_type', 'loc': ('body', 'structured_outputs', 'json', 'str'), 'msg': 'Input should be a valid string', 'input': 5}\n  {'type': 'dict_type', 'loc': ('body', 'structured_outputs', 'json', 'dict[any,any]'), 'msg': 'Input should be a valid dictionary', 'input': 5}");
    expect_validation(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"choice\":[\"a\",1]}}", "body.structured_outputs.choice.1",
                      "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'structured_outputs', 'choice', 1), 'msg': 'Input should be a valid string', 'input': 1}");
    expect_validation(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a\",\"disable_any_whitespace\":null}}",
                      "body.structured_outputs.disable_any_whitespace",
                      "1 validation error:\n  {'type': 'bool_type', 'loc': ('body', 'structured_outputs', 'disable_any_whitespace'), 'msg': 'Input should be a valid boolean', 'input': None}");
    expect_error(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":5}}", 400, "body.structured_outputs.regex", "'type': 'string_type'");
    expect_error(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"grammar\":[]}}", 400, "body.structured_outputs.grammar", "'type': 'string_type'");
    expect_error(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a\",\"whitespace_pattern\":1}}", 400,
                 "body.structured_outputs.whitespace_pattern", "'type': 'string_type'");
    /* __post_init__: exactly one constraint. */
    expect_validation(C, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a\",\"json_object\":\"yes\",\"disable_any_whitespace\":1}}",
                      "body.structured_outputs",
                      "1 validation error:\n  {'type': 'value_error', 'loc': ('body', 'structured_outputs'), 'msg': \"Value error, You can only use one kind of structured outputs constraint but multiple are specified: {'json': None, 'regex': 'a', 'choice': None, 'grammar': None, 'json_object': True, 'disable_any_whitespace': True, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None}\", 'input': {'regex': 'a', 'json_object': 'yes', 'disable_any_whitespace': 1}, 'ctx': {'error': VLLMValidationError(\"You can only use one kind of structured outputs constraint but multiple are specified: {'json': None, 'regex': 'a', 'choice': None, 'grammar': None, 'json_object': True, 'disable_any_whitespace': True, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None}\")}}");
    expect_validation(C, "{\"prompt\":\"a\",\"structured_outputs\":{}}", "body.structured_outputs",
                      "1 validation error:\n  {'type': 'value_error', 'loc': ('body', 'structured_outputs'), 'msg': \"Value error, You must use one kind of structured outputs constraint but none are specified: {'json': None, 'regex': None, 'choice': None, 'grammar': None, 'json_object': None, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None}\", 'input': {}, 'ctx': {'error': VLLMValidationError(\"You must use one kind of structured outputs constraint but none are specified: {'json': None, 'regex': None, 'choice': None, 'grammar': None, 'json_object': None, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None}\")}}");

    /* Forced tool choices need no tool-call parser; "required" is an array of {name, parameters}. */
    cv_api_chat_config plain = {.tmpl = qwen3_tmpl, .think_start_id = -1, .think_end_id = -1};
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.chat = &plain;
    cv_api_error err;
    const char *required = CHAT_FORCED("\"required\"}");
    CHECK(cv_api_parse_chat(required, strlen(required), &l, &r, &err) == 0);
    CHECK(r.has_constraint && r.constraint.kind == CVLLM_CONSTRAINT_JSON && !r.parse_tool_calls);
    cv_api_request_free(&r);
    expect_constraint(CHAT_FORCED("\"required\"}"), CVLLM_CONSTRAINT_JSON, REQUIRED_WEATHER_SCHEMA);
    /* The tool schema replaces structured_outputs (the tool parser's adjust_request). */
    expect_constraint(CHAT_FORCED("\"required\",\"structured_outputs\":{\"regex\":\"x\"}}"), CVLLM_CONSTRAINT_JSON,
                      REQUIRED_WEATHER_SCHEMA);
    expect_error(CV_API_CHAT, CHAT_FORCED("\"required\",\"response_format\":{\"type\":\"json_object\"}}"), 400, "",
                 "You can only use one kind of structured outputs constraint but multiple are specified: {'json': {'type': 'array'");
    /* A named tool: its parameters; none, and nothing is forced. */
    expect_constraint(CHAT_FORCED("{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}"), CVLLM_CONSTRAINT_JSON,
                      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}");
    expect_no_constraint("{\"messages\":" USER_HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}],"
                         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}}}");
    expect_constraint("{\"messages\":" USER_HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}],"
                      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}},\"response_format\":{\"type\":"
                      "\"json_object\"}}",
                      CVLLM_CONSTRAINT_JSON_OBJECT, NULL);
    /* A tool without parameters takes any object; $defs move to the top, merged. */
    expect_constraint("{\"messages\":" USER_HI ",\"tool_choice\":\"required\",\"tools\":["
                      "{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"$ref\":\"#/$defs/P\",\"$defs\":{\"P\":{\"type\":\"integer\"}}}}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":{\"$defs\":{\"P\":{\"type\":\"integer\"},\"Q\":{}}}}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"c\",\"parameters\":{}}}]}",
                      CVLLM_CONSTRAINT_JSON,
                      "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"anyOf\":["
                      "{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"a\"]},\"parameters\":{\"$ref\":\"#/$defs/P\"}},\"required\":[\"name\",\"parameters\"]},"
                      "{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"b\"]},\"parameters\":{}},\"required\":[\"name\",\"parameters\"]},"
                      "{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"c\"]},\"parameters\":{\"type\":\"object\",\"properties\":{}}},\"required\":[\"name\",\"parameters\"]}]},"
                      "\"$defs\":{\"P\":{\"type\":\"integer\"},\"Q\":{}}}");
    expect_error(CV_API_CHAT, "{\"messages\":" USER_HI ",\"tool_choice\":\"required\",\"tools\":["
                              "{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"$defs\":{\"P\":{\"type\":\"integer\"}}}}},"
                              "{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":{\"$defs\":{\"P\":{\"type\":\"string\"}}}}}]}",
                 400, "", "Tool definition 'P' has multiple schemas, which is not supported.");
    /* tool_choice none and auto leave the output to response_format. */
    expect_constraint(CHAT_FORCED("\"none\",\"response_format\":{\"type\":\"json_object\"}}"), CVLLM_CONSTRAINT_JSON_OBJECT, NULL);
    expect_no_constraint(CHAT_FORCED("\"auto\"}"));

    /* With --reasoning-parser the constraint waits for "</think>" while the prompt leaves the reasoning
     * to the output (Qwen3's template opens none, the model does); enable_thinking=false closed it. */
    cv_api_structured_config in_reasoning = {.enable_in_reasoning = true};
    const char *so = "{\"messages\":" USER_HI ",\"structured_outputs\":{\"regex\":\"a\"}";
    char body[512];
    snprintf(body, sizeof body, "%s}", so);
    if (parse_structured(body, NULL, &r)) CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, qwen3_chat.think_end_id);
    cv_api_request_free(&r);
    if (parse_structured(body, &in_reasoning, &r)) CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, -1);
    cv_api_request_free(&r);
    snprintf(body, sizeof body, "%s,\"chat_template_kwargs\":{\"enable_thinking\":false}}", so);
    if (parse_structured(body, NULL, &r)) CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, -1);
    cv_api_request_free(&r);
    snprintf(body, sizeof body, "{\"messages\":" USER_HI "}");
    if (parse_structured(body, NULL, &r)) CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, -1);
    cv_api_request_free(&r);
    /* The Qwen3.6 template opens <think> in the prompt. */
    cv_api_chat_config c36 = {.tmpl = qwen36_tmpl, .reasoning_parser = true, .think_start_id = qwen3_chat.think_start_id,
                              .think_end_id = qwen3_chat.think_end_id};
    l.chat = &c36;
    snprintf(body, sizeof body, "%s}", so);
    if (cv_api_parse_chat(body, strlen(body), &l, &r, &err) == 0 && cv_api_prepare(&r, tok, &l, &err) == 0)
        CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, c36.think_end_id);
    else
        CHECK_MSG(0, "%s", err.message);
    cv_api_request_free(&r);
    /* No reasoning parser, or a completion: from the first token. */
    l.chat = &plain;
    if (cv_api_parse_chat(body, strlen(body), &l, &r, &err) == 0 && cv_api_prepare(&r, tok, &l, &err) == 0)
        CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, -1);
    cv_api_request_free(&r);
    if (parse_structured("{\"prompt\":\"<think>\",\"structured_outputs\":{\"regex\":\"a\"}}", NULL, &r))
        CHECK_EQ_INT(cv_api_prompt_params(&r, 0).grammar_after_token_id, -1);
    cv_api_request_free(&r);
}

/* Forced tool choices read back: the message and the stream (cut anywhere) give the same calls. */
static void test_forced_tool_output(void) {
    cv_api_chat_config plain = {.tmpl = qwen3_tmpl, .think_start_id = -1, .think_end_id = -1};
    const char *weather = "{\"city\": \"Paris\"}";
#define NAMED_WEATHER CHAT_FORCED("{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}")
#define REQUIRED CHAT_FORCED("\"required\"")
    const output_case cases[] = {
        /* Named: the content is the arguments, as generated; finish_reason stays "stop". */
        {&plain, NAMED_WEATHER, "{\"city\":  \"Paris\" }", CVLLM_FINISH_STOP, NULL, "",
         {{"get_weather", "{\"city\":  \"Paris\" }"}}, "stop"},
        {&plain, NAMED_WEATHER, "{\"city\": \"Par", CVLLM_FINISH_LENGTH, NULL, "", {{"get_weather", "{\"city\": \"Par"}}, "length"},
        {&plain, NAMED_WEATHER, "", CVLLM_FINISH_STOP, NULL, "", {{"get_weather", ""}}, "stop"},
        /* With a reasoning parser the reasoning stays reasoning. */
        {&qwen3_chat, NAMED_WEATHER, "<think>Paris.</think>{\"city\": \"Paris\"}", CVLLM_FINISH_STOP, "Paris.", "",
         {{"get_weather", weather}}, "stop"},
        /* Required: an array of calls, each one's parameters as Python's json.dumps writes them. */
        {&plain, REQUIRED, "[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}}]", CVLLM_FINISH_STOP, NULL, "",
         {{"get_weather", weather}}, "tool_calls"},
        {&plain, REQUIRED, " [ {\"parameters\": {\"city\": \"Par]}\\\"is\"}, \"name\": \"get_weather\"},\n{\"name\": \"get_weather\", "
         "\"parameters\": {\"city\": \"Rome\"}} ]",
         CVLLM_FINISH_STOP, NULL, "", {{"get_weather", "{\"city\": \"Par]}\\\"is\"}"}, {"get_weather", "{\"city\": \"Rome\"}"}},
         "tool_calls"},
        {&plain, REQUIRED ",\"parallel_tool_calls\":false",
         "[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}},{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Rome\"}}]",
         CVLLM_FINISH_STOP, NULL, "", {{"get_weather", weather}}, "tool_calls"},
        /* Cut off by max_tokens: the complete calls; an element that is no call is skipped. */
        {&plain, REQUIRED, "[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}},{\"name\":\"get_w", CVLLM_FINISH_LENGTH,
         NULL, "", {{"get_weather", weather}}, "tool_calls"},
        {&plain, REQUIRED, "[{\"parameters\":{}},{\"name\":\"get_weather\",\"parameters\":null}]", CVLLM_FINISH_STOP, NULL, "",
         {{"get_weather", "null"}}, "tool_calls"},
        {&plain, REQUIRED, "not json", CVLLM_FINISH_STOP, NULL, "", {{0}}, "stop"},
        {&qwen3_chat, REQUIRED, "<think>\nhmm\n</think>\n\n[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}}]",
         CVLLM_FINISH_STOP, "\nhmm\n", "", {{"get_weather", weather}}, "tool_calls"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) check_output_case(&cases[i]);
#undef NAMED_WEATHER
#undef REQUIRED
}

/* ---- beam search (engine/beam_search.h, server/beam_driver.h), fed made-up step results ----------------------------------- */

enum { EOS = 151645 }; /* <|im_end|>, Qwen3's eos_token */

static cvllm_position_logprobs step_result(cvllm_logprob chosen, const cvllm_logprob *top, int32_t n_top) {
    return (cvllm_position_logprobs){.chosen = chosen, .top = top, .n_top = n_top};
}

static void check_output(const cv_completion_delta *d, const int32_t *ids, size_t n, cvllm_finish_reason finish) {
    CHECK_EQ_INT(d->n_token_ids, n);
    for (size_t i = 0; i < n && i < d->n_token_ids; i++) CHECK_EQ_INT(d->token_ids[i], ids[i]);
    CHECK_EQ_INT(d->finish_reason, finish);
    CHECK_EQ_INT(d->stop_token_id, finish == CVLLM_FINISH_STOP ? EOS : -1);
}

/* Width 2, two steps, prompt of 3 tokens (lengths 3 + output in the score):
 *   step 1: top 10 (-0.1), 11 (-0.5), eos (-1.0), 12 (-2.0); sampled 10. The eos candidate finishes
 *           "" at -1.0; the beams are [10] -0.1 and [11] -0.5.
 *   step 2: [10]: top 13 (-2.0), 14 (-2.5), 15 (-3), 16 (-4), sampled 99 (-5.0), outside the top;
 *           [11]: top 17 (-0.05), eos (-0.1), 18 (-1), 19 (-2), sampled 17. [11]+eos finishes at
 *           -0.6; the beams are [11 17] -0.55 and [11 18] -1.5 ([10 13] is -2.1).
 *   ranked by cum / len: [11 17] -0.55/5, [11] -0.6/4 (eos not counted where kept), [11 18] -1.5/5,
 *   "" -1.0/3, [10 13] was never kept. */
static cv_beam_search *two_steps(bool include_stop, int32_t top_logprobs) {
    const cv_beam_config cfg = {.width = 2, .max_tokens = 2, .length_penalty = 1.0f, .eos_token_id = EOS,
                                .include_stop_str_in_output = include_stop, .top_logprobs = top_logprobs, .n_prompt = 3};
    cv_beam_search *bs = cv_beam_search_new(&cfg);
    CHECK_EQ_INT(cv_beam_search_step_logprobs(bs), top_logprobs > 4 ? top_logprobs : 4);
    const cvllm_logprob t1[] = {{10, -0.1f, 1}, {11, -0.5f, 2}, {EOS, -1.0f, 3}, {12, -2.0f, 4}};
    cvllm_position_logprobs r1[] = {step_result(t1[0], t1, 4)};
    CHECK_EQ_INT(cv_beam_search_live(bs), 1);
    cv_beam_search_step(bs, r1);
    CHECK_EQ_INT(cv_beam_search_live(bs), 2);
    size_t n;
    const int32_t *b0 = cv_beam_search_tokens(bs, 0, &n);
    CHECK(n == 1 && b0[0] == 10);
    const int32_t *b1 = cv_beam_search_tokens(bs, 1, &n);
    CHECK(n == 1 && b1[0] == 11);
    const cvllm_logprob t2a[] = {{13, -2.0f, 1}, {14, -2.5f, 2}, {15, -3.0f, 3}, {16, -4.0f, 4}};
    const cvllm_logprob t2b[] = {{17, -0.05f, 1}, {EOS, -0.1f, 2}, {18, -1.0f, 3}, {19, -2.0f, 4}};
    cvllm_position_logprobs r2[] = {step_result((cvllm_logprob){99, -5.0f, 900}, t2a, 4), step_result(t2b[0], t2b, 4)};
    cv_beam_search_step(bs, r2);
    CHECK_EQ_INT(cv_beam_search_live(bs), 0); /* max_tokens reached */
    return bs;
}

static void test_beam_search(void) {
    const int32_t prompt[] = {40, 1079, 304};
    cv_beam_search *bs = two_steps(false, -1);
    cv_request_event *ev = cv_beam_result_event(bs, tok, prompt);
    CHECK(ev->finished && ev->n_prompt_token_ids == 3 && ev->prompt_token_ids[2] == 304);
    CHECK_EQ_INT(ev->n_outputs, 2);
    check_output(&ev->outputs[0], (const int32_t[]){11, 17}, 2, CVLLM_FINISH_LENGTH);
    check_output(&ev->outputs[1], (const int32_t[]){11}, 1, CVLLM_FINISH_STOP);
    CHECK(ev->outputs[0].logprobs == NULL);
    char *text = NULL;
    CHECK(cvllm_detokenize(tok, (const int32_t[]){11}, 1, false, &text) == CVLLM_OK);
    CHECK_STR_EQ(ev->outputs[1].text, text);
    cvllm_free(text);
    cv_request_event_free(ev);
    cv_beam_search_free(bs);

    /* include_stop_str_in_output keeps eos in token_ids, not in the text; logprobs keep every
     * position's step entries, the chosen token's own entry first */
    bs = two_steps(true, 3);
    ev = cv_beam_result_event(bs, tok, prompt);
    CHECK_EQ_INT(ev->n_outputs, 2);
    check_output(&ev->outputs[1], (const int32_t[]){11, EOS}, 2, CVLLM_FINISH_STOP);
    char *text11 = NULL;
    CHECK(cvllm_detokenize(tok, (const int32_t[]){11}, 1, false, &text11) == CVLLM_OK);
    CHECK_STR_EQ(ev->outputs[1].text, text11);
    cvllm_free(text11);
    const cvllm_position_logprobs *lp = ev->outputs[0].logprobs;
    CHECK(lp != NULL);
    if (lp) {
        CHECK(lp[0].chosen.token_id == 11 && lp[0].chosen.rank == 2 && lp[0].n_top == 4 && lp[0].top[0].token_id == 10);
        CHECK(lp[1].chosen.token_id == 17 && fabsf(lp[1].chosen.logprob + 0.05f) < 1e-6f && lp[1].top[1].token_id == EOS);
    }
    lp = ev->outputs[1].logprobs;
    CHECK(lp && lp[1].chosen.token_id == EOS && lp[1].chosen.rank == 2);
    cv_request_event_free(ev);
    cv_beam_search_free(bs);

    /* length_penalty 0 ranks by the cumulative logprob alone: [11 17] -0.55, [11] -0.6 */
    const cv_beam_config flat = {.width = 3, .max_tokens = 1, .length_penalty = 0.0f, .eos_token_id = EOS,
                                 .top_logprobs = -1, .n_prompt = 3};
    bs = cv_beam_search_new(&flat);
    const cvllm_logprob t[] = {{5, -0.3f, 1}, {6, -0.4f, 2}, {7, -0.9f, 3}, {8, -1.0f, 4}, {9, -1.1f, 5}, {3, -1.2f, 6}};
    /* a sampled eos outside the top entries finishes a hypothesis too (vLLM's logprobs hold it) */
    cvllm_position_logprobs r[] = {step_result((cvllm_logprob){EOS, -0.5f, 40}, t, 6)};
    cv_beam_search_step(bs, r);
    ev = cv_beam_result_event(bs, tok, prompt);
    CHECK_EQ_INT(ev->n_outputs, 3);
    check_output(&ev->outputs[0], (const int32_t[]){5}, 1, CVLLM_FINISH_LENGTH);
    check_output(&ev->outputs[1], (const int32_t[]){6}, 1, CVLLM_FINISH_LENGTH);
    check_output(&ev->outputs[2], NULL, 0, CVLLM_FINISH_STOP);
    cv_request_event_free(ev);
    cv_beam_search_free(bs);

    /* ignore_eos: eos is a token like any other */
    const cv_beam_config no_stop = {.width = 1, .max_tokens = 1, .length_penalty = 1.0f, .eos_token_id = EOS,
                                    .ignore_eos = true, .top_logprobs = -1, .n_prompt = 3};
    bs = cv_beam_search_new(&no_stop);
    const cvllm_logprob te[] = {{EOS, -0.1f, 1}, {6, -0.4f, 2}};
    cvllm_position_logprobs re[] = {step_result(te[0], te, 2)};
    cv_beam_search_step(bs, re);
    ev = cv_beam_result_event(bs, tok, prompt);
    CHECK_EQ_INT(ev->n_outputs, 1);
    check_output(&ev->outputs[0], (const int32_t[]){EOS}, 1, CVLLM_FINISH_LENGTH);
    CHECK(strstr(ev->outputs[0].text, "<|im_end|>") != NULL); /* decoded with special tokens, as vLLM */
    cv_request_event_free(ev);
    cv_beam_search_free(bs);

    /* the request: n is the width; length_penalty kept */
    cv_api_request req;
    parse_ok(CV_API_COMPLETION, "{\"prompt\":\"a\",\"use_beam_search\":true,\"n\":3,\"length_penalty\":0.5}", &req, 64);
    CHECK(req.beam_search && req.params.n == 3 && req.length_penalty == 0.5f);
    cv_api_request_free(&req);
    parse_ok(CV_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"use_beam_search\":true}", &req, 64);
    CHECK(req.beam_search && req.params.n == 1 && req.length_penalty == 1.0f);
    cv_api_request_free(&req);
}

/* --exclude-tools-when-tool-choice-none: tool_choice "none" renders the prompt without the tools */
static void test_exclude_tools_when_none(void) {
    static const char with_none[] = "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":\"none\"}";
    cv_api_request plain, kept, dropped;
    parse_ok(CV_API_CHAT, "{\"messages\":" USER_HI "}", &plain, 4096);
    parse_ok(CV_API_CHAT, with_none, &kept, 4096);
    CHECK_CONTAINS(kept.prompts[0].text, "<tools>");
    cv_api_chat_config exclude = qwen3_chat;
    exclude.exclude_tools_when_none = true;
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.chat = &exclude;
    cv_api_error err = {0};
    CHECK(cv_api_parse_chat(with_none, strlen(with_none), &l, &dropped, &err) == 0);
    CHECK_STR_EQ(dropped.prompts[0].text, plain.prompts[0].text);
    cv_api_request_free(&dropped);
    /* auto keeps them */
    static const char with_auto[] = "{\"messages\":" USER_HI ",\"tools\":" WEATHER_TOOL ",\"tool_choice\":\"auto\"}";
    CHECK(cv_api_parse_chat(with_auto, strlen(with_auto), &l, &dropped, &err) == 0);
    CHECK_CONTAINS(dropped.prompts[0].text, "<tools>");
    cv_api_request_free(&dropped);
    cv_api_request_free(&kept);
    cv_api_request_free(&plain);
}

/* --return-tokens-as-token-ids is the default of a request's return_tokens_as_token_ids, which a
 * request's own true or false overrides and its null does not (vLLM's `request value if not None
 * else the server's`); so are SageMaker's /invocations bodies, either kind. */
static void test_tokens_as_ids_default(void) {
    static const char *const bodies[] = {"{\"prompt\":\"x\"}", "{\"prompt\":\"x\",\"return_tokens_as_token_ids\":null}",
                                         "{\"prompt\":\"x\",\"return_tokens_as_token_ids\":false}",
                                         "{\"prompt\":\"x\",\"return_tokens_as_token_ids\":true}",
                                         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"};
    const bool want[2][5] = {{false, false, false, true, false}, {true, true, false, true, true}};
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    l.chat = &qwen3_chat;
    for (int flag = 0; flag < 2; flag++) {
        l.tokens_as_ids = flag;
        for (int k = 0; k < 5; k++) {
            cv_api_request r;
            cv_api_error err;
            const int rc = cv_api_parse_invocation(bodies[k], strlen(bodies[k]), &l, &r, &err);
            CHECK_MSG(rc == 0 && r.tokens_as_ids == want[flag][k], "flag %d, %s: rc %d, %d", flag, bodies[k], rc,
                      r.tokens_as_ids);
            CHECK_EQ_INT(r.kind, k == 4 ? CV_API_CHAT : CV_API_COMPLETION);
            cv_api_request_free(&r);
        }
    }
}

/* --enable-log-requests prints the engine's parameters as vLLM's SamplingParams.__repr__ does: Python's
 * float reprs (shortest round trip, 1.0, 1e-05), str reprs (quotes chosen as Python chooses them),
 * None for what is unset. */
/* The Anthropic event stream made of chat SSE records fed in two pieces (the state carries over):
 * reasoning becomes a thinking block closed by its signature, content a text block, a stop string
 * stop_reason "stop_sequence" with the string, the usage chunk message_delta, [DONE] message_stop
 * then vLLM's [DONE]; an error record an error event. */
static void test_anthropic_stream(void) {
#define CHUNK(delta, finish) \
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":" delta ",\"finish_reason\":" finish "}]," \
    "\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\n"
    const char *first = CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null") CHUNK("{\"reasoning\":\"Let me\"}", "null")
        CHUNK("{\"reasoning\":\" think\"}", "null");
    const char *second = CHUNK("{\"content\":\"Paris\"}", "null")
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\".\"},\"finish_reason\":"
        "\"stop\",\"stop_reason\":\"END\"}]}\n\n"
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\n"
        "data: [DONE]\n\n";
#undef CHUNK
    cv_anthropic_stream *st = cv_anthropic_stream_new();
    char *buf = NULL, *all = NULL;
    size_t len = 0, cap = 0, all_len = 0, all_cap = 0;
    for (int k = 0; k < 2; k++) {
        const char *piece = k ? second : first;
        len = 0;
        cv_buf_append(&buf, &len, &cap, piece, strlen(piece));
        cv_anthropic_stream_convert(st, &buf, &len, &cap);
        cv_buf_append(&all, &all_len, &all_cap, buf, len);
    }
    cv_buf_append(&all, &all_len, &all_cap, "", 1);
    static const char *const want[] = {
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"type\":\"message\","
        "\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":"
        "{\"input_tokens\":7,\"output_tokens\":0}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
        "\"thinking\",\"thinking\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
        "\"thinking_delta\",\"thinking\":\"Let me\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
        "\"thinking_delta\",\"thinking\":\" think\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
        "\"signature_delta\",\"signature\":\"", /* 32 hex digits */
        "\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":"
        "\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\","
        "\"text\":\"Paris\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\","
        "\"text\":\".\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"stop_sequence\","
        "\"stop_sequence\":\"END\"},\"usage\":{\"input_tokens\":7,\"output_tokens\":5}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\ndata: [DONE]\n\n",
    };
    const char *at = all;
    for (size_t k = 0; k < CV_ARRAY_LEN(want) && at; k++) {
        CHECK_MSG(!strncmp(at, want[k], strlen(want[k])), "event %zu: expected %s, got %.200s", k, want[k], at);
        at += strlen(want[k]);
        if (k == 4) { /* the signature */
            size_t hex = strspn(at, "0123456789abcdef");
            CHECK_EQ_INT((int)hex, 32);
            at += hex;
        }
    }
    CHECK(at && *at == 0);
    /* an error inside the stream */
    len = 0;
    const char *error = "data: {\"error\":{\"message\":\"boom\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n";
    cv_buf_append(&buf, &len, &cap, error, strlen(error));
    cv_anthropic_stream_convert(st, &buf, &len, &cap);
    cv_buf_append(&buf, &len, &cap, "", 1);
    CHECK_STR_EQ(buf, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"InternalServerError\",\"message\":"
                      "\"boom\"}}\n\n");
    cv_anthropic_stream_free(st);
    free(buf);
    free(all);
}

/* The Responses events made of chat SSE records: a reasoning item, a message and a function call,
 * each opened, written and closed in order with their ids and texts, sequence numbers from 0,
 * response.created / in_progress first and response.completed with every item and the usage last;
 * no [DONE]. The request's settings are echoed (instructions, tools, max_output_tokens). */
static void test_responses_stream(void) {
    cv_api_limits l = limits(4096, QWEN3_VOCAB);
    cv_api_request req;
    cv_api_error err;
    const char *body = "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":\"Hi\",\"max_output_tokens\":9,\"stream\":true,"
                       "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}]}";
    CHECK(cv_api_parse_responses(body, strlen(body), &l, NULL, NULL, &req, &err) == 0 && cv_api_prepare(&req, tok, &l, &err) == 0);
    CHECK(req.stream && req.include_usage && req.continuous_usage && req.responses);
#define CHUNK(delta, finish) \
    "data: {\"id\":\"chatcmpl-ab\",\"created\":5,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":" delta \
    ",\"finish_reason\":" finish "}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\n"
    const char *chat = CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null") CHUNK("{\"reasoning\":\"Hm\"}", "null")
        CHUNK("{\"content\":\"Yes\"}", "null")
        CHUNK("{\"tool_calls\":[{\"index\":0,\"id\":\"chatcmpl-tool-cd\",\"type\":\"function\",\"function\":{\"name\":\"f\","
              "\"arguments\":\"{\\\"a\\\"\"}}]}", "null")
        CHUNK("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\": 1}\"}}]}", "\"tool_calls\"")
        "data: {\"id\":\"chatcmpl-ab\",\"created\":5,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
        "\"completion_tokens\":4}}\n\n"
        "data: [DONE]\n\n";
#undef CHUNK
    cv_responses_stream *st = cv_responses_stream_new(&req);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    cv_buf_append(&buf, &len, &cap, chat, strlen(chat));
    cv_responses_stream_convert(st, &buf, &len, &cap);
    cv_buf_append(&buf, &len, &cap, "", 1);
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
    const char *p = buf;
    json_t *completed = NULL;
    for (size_t k = 0; k < CV_ARRAY_LEN(want); k++) {
        char head[96];
        snprintf(head, sizeof head, "event: %s\ndata: ", want[k]);
        CHECK_MSG(!strncmp(p, head, strlen(head)), "event %zu: expected %s, got %.120s", k, want[k], p);
        const char *end = strstr(p, "\n\n");
        if (strncmp(p, head, strlen(head)) || !end) break;
        json_t *d = json_loadb(p + strlen(head), (size_t)(end - p - strlen(head)), 0, NULL);
        CHECK_EQ_INT((int)json_integer_value(json_object_get(d, "sequence_number")), (int)k);
        if (k == 18) CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(d, "item"), "arguments")), "{\"a\": 1}");
        if (k + 1 == CV_ARRAY_LEN(want)) completed = json_incref(json_object_get(d, "response"));
        json_decref(d);
        p = end + 2;
    }
    CHECK(*p == 0);
    const json_t *out = json_object_get(completed, "output");
    CHECK_EQ_INT((int)json_array_size(out), 3);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(out, 0), "id")), "rs_ab");
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(out, 0), "content"), 0),
                                                   "text")), "Hm");
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(out, 1), "content"), 0),
                                                   "text")), "Yes");
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(out, 2), "call_id")), "call_cd");
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(out, 2), "id")), "fc_cd");
    CHECK_STR_EQ(json_string_value(json_object_get(completed, "id")), "resp_ab");
    CHECK_STR_EQ(json_string_value(json_object_get(completed, "status")), "completed");
    CHECK_STR_EQ(json_string_value(json_object_get(completed, "instructions")), "Be brief.");
    CHECK_EQ_INT((int)json_integer_value(json_object_get(completed, "max_output_tokens")), 9);
    CHECK_EQ_INT((int)json_array_size(json_object_get(completed, "tools")), 1);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(completed, "usage"), "total_tokens")), 11);
    json_decref(completed);
    cv_responses_stream_free(st);
    free(buf);
    cv_api_request_free(&req);
}

/* embed_chunks.c: chunk counts, the weighted mean of a prompt's chunk vectors (non-final events carry
 * nothing), the whole prompt's usage, and a chunk without a vector (aborted) losing the prompt's. */
static void test_embed_chunks(void) {
    CHECK(cv_embed_chunk_count(20, 0) == 1 && cv_embed_chunk_count(8, 8) == 1 && cv_embed_chunk_count(9, 8) == 2 &&
          cv_embed_chunk_count(24, 8) == 3);
    cv_embed_chunks c;
    cv_embed_chunks_init(&c, 20, 8);
    CHECK(c.n_chunks == 3 && c.left == 3);
    const float v[3][2] = {{1, 0}, {0, 1}, {1, 1}};
    const size_t n[3] = {8, 8, 4};
    cv_request_event running = {.n_prompt_token_ids = 8};
    CHECK(!cv_embed_chunks_fold(&c, &running) && c.left == 3);
    for (size_t k = 0; k < 3; k++) {
        cv_request_event ev = {.n_prompt_token_ids = n[k], .n_cached_tokens = k == 0 ? 8 : 0, .finished = true,
                               .embedding = cv_xmalloc(sizeof v[k]), .n_embedding = 2};
        memcpy(ev.embedding, v[k], sizeof v[k]);
        const bool last = cv_embed_chunks_fold(&c, &ev);
        CHECK(last == (k == 2));
        if (last) {
            CHECK(ev.n_embedding == 2 && fabsf(ev.embedding[0] - 12.f / 20) < 1e-7f && fabsf(ev.embedding[1] - 12.f / 20) < 1e-7f);
            CHECK(ev.n_prompt_token_ids == 20 && ev.n_cached_tokens == 8);
        }
        free(ev.embedding);
    }
    cv_embed_chunks_free(&c);
    cv_embed_chunks_init(&c, 9, 8);
    cv_request_event aborted = {.n_prompt_token_ids = 8, .finished = true};
    CHECK(!cv_embed_chunks_fold(&c, &aborted));
    cv_request_event rest = {.n_prompt_token_ids = 1, .finished = true, .embedding = cv_xmalloc(sizeof(float)), .n_embedding = 1};
    rest.embedding[0] = 1;
    CHECK(cv_embed_chunks_fold(&c, &rest) && !rest.embedding && rest.n_embedding == 0 && rest.n_prompt_token_ids == 9);
    cv_embed_chunks_free(&c);
}

static void test_sampling_params_repr(void) {
    cvllm_sampling_params p;
    cvllm_sampling_params_default(NULL, &p);
    static const char *const stop[] = {"a", "it's", "tab\there"};
    static const int32_t stop_ids[] = {151645, 7};
    p.temperature = 0.7f, p.top_p = 1.0f, p.top_k = 20, p.min_p = 1e-5f, p.max_tokens = 64, p.presence_penalty = 1.5f;
    p.repetition_penalty = 100000.0f;
    p.stop = stop, p.n_stop = 3, p.stop_token_ids = stop_ids, p.n_stop_token_ids = 2;
    p.logprobs = 2;
    char *r = cv_sampling_params_repr(&p, -2, NULL);
    CHECK_STR_EQ(r, "SamplingParams(n=1, presence_penalty=1.5, frequency_penalty=0.0, repetition_penalty=100000.0, "
                    "temperature=0.7, top_p=1.0, top_k=20, min_p=1e-05, seed=None, stop=['a', \"it's\", 'tab\\there'], "
                    "stop_token_ids=[151645, 7], bad_words=[], include_stop_str_in_output=False, ignore_eos=False, "
                    "max_tokens=64, min_tokens=0, logprobs=2, prompt_logprobs=None, skip_special_tokens=True, "
                    "spaces_between_special_tokens=True, truncate_prompt_tokens=None, structured_outputs=None, "
                    "extra_args=None)");
    free(r);
    p.has_seed = true, p.seed = 42, p.temperature = 3e16f;
    const cvllm_constraint c = {.kind = CVLLM_CONSTRAINT_REGEX, .spec = "[a-z]+"};
    r = cv_sampling_params_repr(&p, 10, &c);
    CHECK_CONTAINS(r, "seed=42,");
    CHECK_CONTAINS(r, "temperature=3e+16,");
    CHECK_CONTAINS(r, "truncate_prompt_tokens=10, structured_outputs=StructuredOutputsParams(regex='[a-z]+'), ");
    free(r);
}

int main(void) {
    setenv("CVLLM_LOG_LEVEL", "debug", 1); /* test_ignored_fields reads the DEBUG lines */
    CHECK(cvllm_tokenizer_create(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", &tok) == CVLLM_OK);
    CHECK(cv_chat_template_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", NULL, &qwen3_tmpl) == 0);
    CHECK(cv_chat_template_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", CVLLM_TEST_DATA "/chat/qwen3.6.jinja",
                                &qwen36_tmpl) == 0);
    if (!tok || !qwen3_tmpl || !qwen36_tmpl) return cv_check_summary("test_server_api");
    int32_t *think = NULL, *think_end = NULL;
    size_t n_think = 0, n_think_end = 0;
    CHECK(cvllm_tokenize(tok, "<think>", 7, &think, &n_think) == CVLLM_OK && n_think == 1);
    CHECK(cvllm_tokenize(tok, "</think>", 8, &think_end, &n_think_end) == CVLLM_OK && n_think_end == 1);
    qwen3_chat = (cv_api_chat_config){.tmpl = qwen3_tmpl, .reasoning_parser = true, .has_tool_parser = true,
                                      .tool_parser = CV_TOOL_PARSER_HERMES, .auto_tool_choice = true,
                                      .think_start_id = think[0], .think_end_id = think_end[0]};
    cvllm_free(think);
    cvllm_free(think_end);
    test_error_json();
    test_completion_fields();
    test_completion_errors();
    test_chat_render();
    test_chat_errors();
    test_request_template();
    test_tokenize_parse();
    test_chat_content_format();
    test_ignored_fields();
    test_token_strs();
    test_completion_response();
    test_completion_logprobs_and_echo();
    test_chat_stream();
    test_chat_output();
    test_structured_fields();
    test_forced_tool_output();
    test_lax_fields();
    test_vllm_fields();
    test_truncate_prompt_tokens();
    test_return_prompt_text();
    test_metrics_text();
    test_beam_search();
    test_exclude_tools_when_none();
    test_tokens_as_ids_default();
    test_sampling_params_repr();
    test_embed_chunks();
    test_anthropic_stream();
    test_responses_stream();
    cvllm_tokenizer_destroy(tok);
    cv_chat_template_free(qwen3_tmpl);
    cv_chat_template_free(qwen36_tmpl);
    return cv_check_summary("test_server_api");
}
