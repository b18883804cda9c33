/*
 * api.c — the public tokenizer calls of cvllm.h over the internal cv_tokenizer.
 *
 * The public handle is the internal object itself (cvllm_tokenizer is never defined, a
 * cvllm_tokenizer * is a cv_tokenizer *), so the engine can hand out its own tokenizer through
 * cvllm_engine_tokenizer() without a wrapper. MODEL is resolved as for a --load-format dummy engine
 * (loader/resolve.h): a folder, a hub id in the Hugging Face cache, the tokenizer cvllm ships for
 * that id, and only then a download of the tokenizer files.
 */
#include <stdlib.h>

#include "base/error.h"
#include "cvllm.h"
#include "loader/resolve.h"
#include "tokenizer/tokenizer.h"

cvllm_status cvllm_tokenizer_create(const char *model, cvllm_tokenizer **out) {
    if (!out) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_tokenizer_create: out is NULL");
    *out = NULL;
    if (!model || !*model)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_tokenizer_create: no model given");
    char *dir;
    int rc = cv_resolve_model(model, NULL, false, &dir);
    if (rc) return (cvllm_status)rc;
    cv_tokenizer *tok;
    rc = cv_tokenizer_load(dir, &tok);
    free(dir);
    if (rc) return (cvllm_status)rc;
    *out = (cvllm_tokenizer *)tok;
    return CVLLM_OK;
}

void cvllm_tokenizer_destroy(cvllm_tokenizer *tok) { cv_tokenizer_free((cv_tokenizer *)tok); }

cvllm_status cvllm_tokenize(const cvllm_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                            size_t *n_ids) {
    if (!tok || !ids || !n_ids)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_tokenize: NULL argument");
    return (cvllm_status)cv_tokenizer_encode((const cv_tokenizer *)tok, text, len, ids, n_ids);
}

cvllm_status cvllm_tokenizer_add_special_tokens(const cvllm_tokenizer *tok, int32_t **ids, size_t *n_ids) {
    if (!tok) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_tokenizer_add_special_tokens: NULL argument");
    return (cvllm_status)cv_tokenizer_add_special_tokens((const cv_tokenizer *)tok, ids, n_ids);
}

cvllm_status cvllm_detokenize(const cvllm_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              bool skip_special_tokens, char **text) {
    if (!tok || !text) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cvllm_detokenize: NULL argument");
    size_t len;
    return (cvllm_status)cv_tokenizer_decode((const cv_tokenizer *)tok, ids, n_ids,
                                             skip_special_tokens, text, &len);
}

const char *cvllm_tokenizer_config(const cvllm_tokenizer *tok) { return cv_tokenizer_config_json((const cv_tokenizer *)tok); }

int32_t cvllm_tokenizer_vocab_size(const cvllm_tokenizer *tok) {
    return tok ? cv_tokenizer_vocab_size((const cv_tokenizer *)tok) : 0;
}
