/*
 * calibrate.c — see calibrate.h. The KV cache is the smallest the longest prompt needs (one block
 * table, slot = position), and one recurrent-state slot for the hybrid models; both are reused
 * from prompt to prompt, since a sequence starting at position 0 overwrites what it reads.
 */
#include "cli/calibrate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "loader/quant_recipe.h"
#include "loader/weights.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

#define BLOCK 16

const char *const cv_calib_default_prompts[] = {
    "The history of the printing press begins long before Gutenberg. Carved wooden blocks were used in East "
    "Asia to print textiles and later whole books, and movable type made of fired clay appeared centuries "
    "before metal type spread across Europe and changed how knowledge travelled.",
    "Write a Python function that returns the n-th Fibonacci number.\n\n"
    "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "Question: A train leaves at 14:05 and arrives at 17:50. How long is the journey in minutes?\n"
    "Answer: From 14:05 to 17:05 is 180 minutes, and from 17:05 to 17:50 is 45 more, so 225 minutes.",
    "人工智能是计算机科学的一个分支，它试图理解智能的实质，并生产出一种能以与人类智能相似的方式做出反应的智能机器。",
    "Dear team, thank you for your patience during the migration. The new servers are online, the backups "
    "have been verified, and tomorrow morning we will switch the remaining services over one at a time.",
    "In a right triangle the square of the hypotenuse equals the sum of the squares of the other two sides: "
    "a^2 + b^2 = c^2. For a = 3 and b = 4 this gives c = 5.",
    "SELECT name, COUNT(*) AS orders FROM customers JOIN orders ON orders.customer_id = customers.id "
    "GROUP BY name ORDER BY orders DESC LIMIT 10;",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly "
    "quick daft zebras jump!",
    NULL,
};

typedef struct calib {
    cv_model *model;
    cv_kv_cache kv;
    int32_t kv_layers;
    cv_state_cache state;
    int32_t *block_table;
    float *logits;
} calib;

/* Each input into its linear's range, and a routed expert's also into its group's. */
static void observe(void *ctx, const char *linear, const float *x, int64_t rows, int64_t cols) {
    cv_act_ranges_observe(ctx, linear, x, rows, cols);
    char *group = cv_quant_recipe_expert_group(linear);
    if (group) cv_act_ranges_observe(ctx, group, x, rows, cols);
    free(group);
}

static int tokenize_all(const char *dir, const cv_model_config *cfg, const char *const *prompts, size_t n,
                        int32_t **ids, size_t *lens) {
    char *path = cv_xasprintf("%s/tokenizer.json", dir);
    int rc = access(path, F_OK) == 0 ? 0
                                  : cv_fail(CVLLM_ERR_NOT_FOUND, "%s is missing: W8A8 calibration tokenizes its prompts "
                                                                 "with the model's tokenizer", path);
    free(path);
    cv_tokenizer *tok = NULL;
    if (!rc) rc = cv_tokenizer_load(dir, &tok);
    for (size_t i = 0; i < n && !rc; i++) {
        rc = cv_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), &ids[i], &lens[i]);
        if (rc) {
            rc = cv_fail_prefix(rc, "calibration prompt %zu", i + 1);
            break;
        }
        for (size_t t = 0; t < lens[i] && !rc; t++)
            if (ids[i][t] < 0 || ids[i][t] >= cfg->vocab_size)
                rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                             "calibration prompt %zu: token id %d is outside the model's vocabulary (vocab_size %d)",
                             i + 1, ids[i][t], cfg->vocab_size);
        if (lens[i] > CV_CALIB_MAX_TOKENS) {
            cv_info("quantize", "calibration prompt %zu: using its first %d of %zu tokens", i + 1,
                    CV_CALIB_MAX_TOKENS, lens[i]);
            lens[i] = CV_CALIB_MAX_TOKENS;
        }
    }
    cv_tokenizer_free(tok);
    return rc;
}

static int alloc_caches(calib *c, int32_t max_len) {
    const cv_kv_spec *spec = &c->model->kv_spec;
    const int32_t blocks = (max_len + BLOCK - 1) / BLOCK;
    const size_t floats = (size_t)blocks * BLOCK * (size_t)spec->num_kv_heads * (size_t)spec->head_dim;
    c->kv = (cv_kv_cache){.num_blocks = blocks, .block_size = BLOCK};
    c->kv_layers = spec->num_layers;
    c->kv.k = cv_xcalloc((size_t)spec->num_layers + 1, sizeof(float *));
    c->kv.v = cv_xcalloc((size_t)spec->num_layers + 1, sizeof(float *));
    for (int32_t l = 0; l < spec->num_layers; l++) {
        c->kv.k[l] = malloc(floats * sizeof(float));
        c->kv.v[l] = malloc(floats * sizeof(float));
        if (!c->kv.k[l] || !c->kv.v[l]) return cv_fail(CVLLM_ERR_NO_MEMORY, "no memory for the calibration KV cache");
    }
    c->block_table = cv_xmalloc((size_t)blocks * sizeof *c->block_table);
    for (int32_t b = 0; b < blocks; b++) c->block_table[b] = b;
    if (c->model->state_bytes_per_seq) {
        c->state = (cv_state_cache){.num_slots = 1, .slot_bytes = c->model->state_bytes_per_seq,
                                    .data = cv_aligned_alloc(c->model->state_bytes_per_seq)};
        if (!c->state.data) return cv_fail(CVLLM_ERR_NO_MEMORY, "no memory for the calibration state");
    }
    c->logits = malloc((size_t)c->model->vocab_size * sizeof(float));
    return c->logits ? 0 : cv_fail(CVLLM_ERR_NO_MEMORY, "no memory for the calibration logits");
}

static void free_caches(calib *c) {
    for (int32_t l = 0; c->kv.k && l < c->kv_layers; l++) {
        free(c->kv.k[l]);
        free(c->kv.v[l]);
    }
    free(c->kv.k);
    free(c->kv.v);
    free(c->state.data);
    free(c->block_table);
    free(c->logits);
}

/* Prefills one prompt chunk by chunk. */
static int run_prompt(calib *c, const int32_t *ids, int32_t len) {
    int32_t positions[CV_CALIB_CHUNK];
    int64_t slots[CV_CALIB_CHUNK];
    const int32_t state_slot = 0;
    int rc = 0;
    for (int32_t start = 0; start < len && !rc; start += CV_CALIB_CHUNK) {
        const int32_t n = len - start < CV_CALIB_CHUNK ? len - start : CV_CALIB_CHUNK;
        for (int32_t t = 0; t < n; t++) positions[t] = start + t, slots[t] = start + t;
        const int32_t context = start + n, last = n - 1, starts[2] = {0, n};
        const int32_t *tables[1] = {c->block_table};
        cv_batch b = {.n_tokens = n, .token_ids = ids + start, .positions = positions, .slot_mapping = slots,
                      .n_seqs = 1, .seq_start = starts, .context_lens = &context, .block_tables = tables,
                      .state_slots = c->model->state_bytes_per_seq ? &state_slot : NULL, .n_logits = 1,
                      .logit_rows = &last};
        rc = c->model->ops->forward(c->model, &b, &c->kv, c->state.data ? &c->state : NULL, c->logits);
    }
    return rc;
}

int cv_calibrate(const char *dir, const cv_model_config *cfg, const char *const *prompts, size_t n_prompts,
                 cv_threadpool *pool, cv_act_ranges *ranges) {
    int32_t **ids = cv_xcalloc(n_prompts ? n_prompts : 1, sizeof *ids);
    size_t *lens = cv_xcalloc(n_prompts ? n_prompts : 1, sizeof *lens);
    int rc = tokenize_all(dir, cfg, prompts, n_prompts, ids, lens);
    int32_t max_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_prompts; i++) {
        max_len = (int32_t)lens[i] > max_len ? (int32_t)lens[i] : max_len;
        total += lens[i];
    }
    cv_weight_source *src = NULL;
    calib c = {0};
    if (!rc) rc = cv_weight_source_checkpoint(dir, &src);
    if (!rc) {
        cv_model_load_params p = {.config = cfg, .weights = src, .pool = pool, .max_num_batched_tokens = CV_CALIB_CHUNK,
                                  .observe = observe, .observe_ctx = ranges};
        rc = cv_model_load(&p, &c.model);
    }
    if (!rc) rc = alloc_caches(&c, max_len > 0 ? max_len : 1);
    if (!rc) cv_info("quantize", "calibrating on %zu prompts (%zu tokens)", n_prompts, total);
    for (size_t i = 0; i < n_prompts && !rc; i++) {
        if (lens[i] == 0) continue;
        rc = run_prompt(&c, ids[i], (int32_t)lens[i]);
        if (rc) rc = cv_fail_prefix(rc, "calibration prompt %zu", i + 1);
    }
    free_caches(&c);
    cv_model_free(c.model);
    cv_weight_source_free(src);
    for (size_t i = 0; i < n_prompts; i++) free(ids[i]);
    free(ids);
    free(lens);
    return rc;
}
