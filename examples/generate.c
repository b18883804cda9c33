/*
 * generate.c — the smallest complete program on libcvllm: create an engine, queue one prompt, step
 * the engine until the request finishes, print the completion.
 *
 *   cc generate.c $(pkg-config --cflags --libs cvllm) -o generate
 *   ./generate MODEL "Give me a short introduction to large language models." [MAX_TOKENS] [dummy]
 *
 * MODEL is a folder or a hub id (see cvllm_engine_options in cvllm.h); "dummy" as the last argument
 * runs random weights (load_format "dummy"), which needs only the config cvllm ships for the Qwen3
 * ids. Sampling is greedy, so the output is reproducible.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cvllm.h>

static int fail(const char *what, cvllm_engine *engine) {
    fprintf(stderr, "%s: %s\n", what, cvllm_last_error());
    cvllm_engine_destroy(engine);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL PROMPT [MAX_TOKENS] [dummy]\n", argv[0]);
        return 2;
    }
    cvllm_engine_options opts;
    cvllm_engine_options_default(&opts);
    opts.model = argv[1];
    opts.max_model_len = 256; /* the KV cache this example needs, not the model's full context */
    if (argc == 5 && !strcmp(argv[4], "dummy")) opts.load_format = "dummy";

    cvllm_engine *engine = NULL;
    if (cvllm_engine_create(&opts, &engine) != CVLLM_OK) return fail("cannot create the engine", NULL);

    cvllm_sampling_params params;
    cvllm_sampling_params_default(engine, &params);
    params.temperature = 0.0f;
    params.max_tokens = argc >= 4 ? atoi(argv[3]) : 16;
    cvllm_prompt prompt = {.text = argv[2]};
    uint64_t id;
    if (cvllm_engine_add_request(engine, &prompt, &params, &id) != CVLLM_OK) return fail("cannot add the request", engine);

    /* Each step returns the requests that changed; the text of a completion is cumulative. */
    while (cvllm_engine_has_unfinished(engine)) {
        const cvllm_request_output *const *outputs;
        size_t n;
        if (cvllm_engine_step(engine, &outputs, &n) != CVLLM_OK) return fail("engine step failed", engine);
        for (size_t i = 0; i < n; i++) {
            if (outputs[i]->request_id != id || !outputs[i]->finished) continue;
            const cvllm_completion_output *c = &outputs[i]->outputs[0];
            printf("%s\n", c->text);
            fprintf(stderr, "%zu prompt tokens, %zu generated, finish reason %s\n", outputs[i]->n_prompt_token_ids,
                    c->n_token_ids, cvllm_finish_reason_name(c->finish_reason));
        }
    }
    cvllm_engine_destroy(engine);
    return 0;
}
