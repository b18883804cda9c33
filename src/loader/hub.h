/*
 * hub.h — turning the MODEL argument into a local folder.
 *
 * MODEL is either a folder (used as is) or a hub id "ORG/NAME". A hub id is looked up in the Hugging
 * Face cache exactly where huggingface_hub puts it ($HF_HUB_CACHE, else $HF_HOME/hub, else
 * ~/.cache/huggingface/hub; models--ORG--NAME/refs/REVISION names the snapshot in
 * snapshots/COMMIT/). When it is not there and downloads are allowed, the files are fetched with
 * libcurl from $HF_ENDPOINT (default https://huggingface.co), with a bearer token (the caller's, else
 * $HF_TOKEN, else the one `huggingface-cli login` stored: $HF_TOKEN_PATH or $HF_HOME/token), into
 * that same cache layout, resuming partial files (*.incomplete) with HTTP Range requests.
 * VLLM_USE_MODELSCOPE=True switches to ModelScope's endpoint and file API. HF_HUB_OFFLINE=1
 * forbids downloads (a model that would need one fails with CVLLM_ERR_NETWORK, as with no network).
 */
#ifndef CV_HUB_H
#define CV_HUB_H

#include <stdbool.h>

typedef struct cv_hub_options {
    const char *revision;      /* NULL = "main" */
    const char *cache_dir;     /* the cache's root (vLLM's --download-dir); NULL = the environment's */
    const char *token;         /* the bearer token (vLLM's --hf-token TOKEN); NULL = the environment's */
    bool allow_download;
    bool weights;              /* also fetch *.safetensors (false: config + tokenizer files only) */
    bool adapter;              /* a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors),
                                * not a model: what makes a cached snapshot complete */
    bool progress;             /* progress bar on stderr (only when it is a terminal) */
} cv_hub_options;

/* On success *dir is a cv_xmalloc'd path of a folder holding the model's files. */
int cv_hub_resolve(const char *model, const cv_hub_options *opts, char **dir);

#endif
