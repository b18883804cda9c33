/*
 * test_tokenizer_api.c — the public tokenizer calls of cvllm.h: creation from a folder, from a hub
 * id found in a Hugging Face cache (offline, a cache laid out in a temporary folder) and from the
 * tokenizer cvllm ships for an id, encode, decode, vocabulary size, and the messages of every failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "cvllm.h"

#define QWEN_DIR CVLLM_SOURCE_DIR "/models/qwen3-tokenizer"

static void test_folder(void) {
    cvllm_tokenizer *tok = NULL;
    CHECK_EQ_INT(cvllm_tokenizer_create(QWEN_DIR, &tok), CVLLM_OK);
    if (!tok) return;
    CHECK_EQ_INT(cvllm_tokenizer_vocab_size(tok), 151669);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "<|im_start|>Hello, world!<|im_end|>";
    CHECK_EQ_INT(cvllm_tokenize(tok, text, strlen(text), &ids, &n), CVLLM_OK);
    int32_t want[] = {151644, 9707, 11, 1879, 0, 151645};
    CHECK(n == 6 && memcmp(ids, want, sizeof want) == 0);
    char *out = NULL;
    CHECK_EQ_INT(cvllm_detokenize(tok, ids, n, false, &out), CVLLM_OK);
    CHECK_STR_EQ(out, text);
    cvllm_free(out);
    CHECK_EQ_INT(cvllm_detokenize(tok, ids, n, true, &out), CVLLM_OK);
    CHECK_STR_EQ(out, "Hello, world!");
    cvllm_free(out);
    cvllm_free(ids);

    CHECK_EQ_INT(cvllm_tokenize(tok, "a\xff", 2, &ids, &n), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cvllm_last_error(), "invalid UTF-8 at byte offset 1 (0xff)");
    CHECK_EQ_INT(cvllm_tokenize(tok, "a", 1, NULL, &n), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cvllm_last_error(), "cvllm_tokenize: NULL argument");
    int32_t bad = -1;
    CHECK_EQ_INT(cvllm_detokenize(tok, &bad, 1, false, &out), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cvllm_last_error(), "token id -1 at position 0 is out of range (vocabulary size 151669)");
    CHECK_EQ_INT(cvllm_detokenize(NULL, &bad, 1, false, &out), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cvllm_last_error(), "cvllm_detokenize: NULL argument");
    cvllm_tokenizer_destroy(tok);
    cvllm_tokenizer_destroy(NULL);
    CHECK_EQ_INT(cvllm_tokenizer_vocab_size(NULL), 0);
}

static char cache[] = "/tmp/cvllm_tok_hub_XXXXXX";

static void make_cache(void) {
    CHECK(mkdtemp(cache) != NULL);
    char *path;
    const char *dirs[] = {"models--Qwen--Qwen3-0.6B", "models--Qwen--Qwen3-0.6B/refs",
                          "models--Qwen--Qwen3-0.6B/snapshots",
                          "models--Qwen--Qwen3-0.6B/snapshots/0123456789abcdef0123456789abcdef01234567"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        path = cv_xasprintf("%s/%s", cache, dirs[i]);
        CHECK(mkdir(path, 0755) == 0);
        free(path);
    }
    path = cv_xasprintf("%s/models--Qwen--Qwen3-0.6B/refs/main", cache);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("0123456789abcdef0123456789abcdef01234567", f);
        fclose(f);
    }
    free(path);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < 2; i++) {
        char *src = cv_xasprintf("%s/%s", QWEN_DIR, files[i]);
        path = cv_xasprintf("%s/%s/%s", cache, dirs[3], files[i]);
        CHECK(symlink(src, path) == 0);
        free(src);
        free(path);
    }
}

static void test_hub_id(void) {
    make_cache();
    setenv("HF_HUB_CACHE", cache, 1);
    setenv("HF_HUB_OFFLINE", "1", 1);
    cvllm_tokenizer *tok = NULL;
    CHECK_EQ_INT(cvllm_tokenizer_create("Qwen/Qwen3-0.6B", &tok), CVLLM_OK);
    CHECK_EQ_INT(cvllm_tokenizer_vocab_size(tok), 151669);
    cvllm_tokenizer_destroy(tok);
    /* Neither cached nor shipped: it cannot be fetched, and the message lists what is shipped. */
    CHECK_EQ_INT(cvllm_tokenizer_create("Qwen/Not-There", &tok), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cvllm_last_error(), "cannot download Qwen/Not-There: HF_HUB_OFFLINE is set");
    CHECK_CONTAINS(cvllm_last_error(), "cvllm ships configs (for --load-format dummy) only for: ");
    CHECK_CONTAINS(cvllm_last_error(), "Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, Qwen/Qwen3-4B, ");
    CHECK(tok == NULL);
    /* Not cached but shipped: the tokenizer cvllm ships for the id. */
    CHECK_EQ_INT(cvllm_tokenizer_create("Qwen/Qwen3-32B", &tok), CVLLM_OK);
    CHECK_EQ_INT(cvllm_tokenizer_vocab_size(tok), 151669);
    cvllm_tokenizer_destroy(tok);
    char *cmd = cv_xasprintf("rm -rf '%s'", cache);
    CHECK(system(cmd) == 0);
    free(cmd);
}

static void test_create_errors(void) {
    cvllm_tokenizer *tok = (cvllm_tokenizer *)1;
    CHECK_EQ_INT(cvllm_tokenizer_create(NULL, &tok), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cvllm_last_error(), "cvllm_tokenizer_create: no model given");
    CHECK(tok == NULL);
    CHECK_EQ_INT(cvllm_tokenizer_create(QWEN_DIR, NULL), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cvllm_last_error(), "cvllm_tokenizer_create: out is NULL");
    CHECK_EQ_INT(cvllm_tokenizer_create("/nonexistent/folder", &tok), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cvllm_last_error(), "/nonexistent/folder");
    /* A folder without tokenizer files. */
    CHECK_EQ_INT(cvllm_tokenizer_create(CVLLM_SOURCE_DIR "/tests", &tok), CVLLM_ERR_NOT_FOUND);
    CHECK_STR_EQ(cvllm_last_error(), "cannot open " CVLLM_SOURCE_DIR
                 "/tests/tokenizer.json: No such file or directory");
}

int main(void) {
    test_folder();
    test_hub_id();
    test_create_errors();
    return cv_check_summary("test_tokenizer_api");
}
