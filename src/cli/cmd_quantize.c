/*
 * cmd_quantize.c — `cvllm quantize MODEL OUT --scheme w8a8|w8a8_dynamic`: a float (bf16, f16, f32)
 * Qwen3-family checkpoint written as an msModelSlim W8A8 / W8A8_DYNAMIC checkpoint, the layout
 * `--quantization ascend` serves, for users without Ascend's tools (and for tests that need one).
 *
 * The output folder is loader/quant_export.h's to write; the recipe (which linears) is
 * loader/quant_recipe.h's, by default the one msModelSlim uses for the model's family (moe for the
 * MoE families, dense otherwise). W8A8 static needs each quantized linear's activation range: the
 * float model is run over calibration prompts first (cli/calibrate.h), the built-in ones unless
 * --calibration FILE gives others (a prompts file, cli/prompts_file.h).
 *
 * A folder that already declares a quantization (a quant_model_description*.json, a
 * quantization_config in config.json) is refused, so the config.json copied into OUT has no
 * quantization_config to drop. Everything that can be checked is
 * checked before OUT is touched; if writing fails after that, what was written is removed again
 * (OUT had to be empty or absent), so a failed run never leaves a checkpoint that looks complete.
 *
 * Usage errors exit with 2, failures with 1, each as one line "cvllm quantize: message".
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "cli/args.h"
#include "cli/calibrate.h"
#include "cli/commands.h"
#include "cli/prompts_file.h"
#include "loader/config.h"
#include "loader/quant.h"
#include "loader/quant_export.h"
#include "loader/resolve.h"
#include "models/architectures.h"

static const char usage[] =
    "usage: cvllm quantize MODEL OUT --scheme w8a8|w8a8_dynamic [--recipe dense|moe]\n"
    "                      [--calibration FILE] [--max-shard-size SIZE]\n"
    "Writes MODEL (a bf16, f16 or f32 checkpoint: folder or hub id) to the new folder OUT as an\n"
    "msModelSlim W8A8 checkpoint, served with --quantization ascend.\n"
    "  --scheme S          w8a8_dynamic: int8 weights, per-token activation scales at run time;\n"
    "                      w8a8: int8 weights, static per-tensor activation scales from calibration\n"
    "  --recipe R          dense: attention q/k/v/o and every MLP projection; moe: attention q/k/v and\n"
    "                      the routed experts (default: moe for MoE models, dense otherwise)\n"
    "  --calibration FILE  w8a8 only: prompts to calibrate on, one per line (a line starting with '\"'\n"
    "                      is a JSON string); default: a few built-in paragraphs\n"
    "  --max-shard-size S  largest safetensors shard, as Hugging Face spells it (5GB, 500MB, 2GiB,\n"
    "                      or bytes); default 5GB\n";

typedef struct quantize_args {
    const char *model, *out, *calibration;
    cv_linear_scheme scheme;
    bool has_recipe;                /* else the family's */
    cv_quant_recipe recipe;
    uint64_t max_shard_bytes;
} quantize_args;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cvllm quantize: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* Hugging Face's file sizes (convert_file_size_to_int): bytes, or an integer with KB/MB/GB (powers
 * of 1000) or KiB/MiB/GiB (powers of 1024), case-insensitive; a lower-case final "b" on the decimal
 * units means bits (÷ 8). */
static bool parse_size(const char *s, uint64_t *out) {
    static const struct { const char *unit; uint64_t mult; bool decimal; } units[] = {
        {"GIB", 1ull << 30, false}, {"MIB", 1ull << 20, false}, {"KIB", 1ull << 10, false},
        {"GB", 1000000000ull, true}, {"MB", 1000000ull, true},  {"KB", 1000ull, true}, {"", 1, false},
    };
    const size_t len = strlen(s);
    for (size_t u = 0; u < CV_ARRAY_LEN(units); u++) {
        const size_t ul = strlen(units[u].unit);
        if (len <= ul || strcasecmp(s + len - ul, units[u].unit) != 0) continue;
        uint64_t v = 0;
        for (size_t i = 0; i < len - ul; i++) {
            const uint64_t digit = (uint64_t)(s[i] - '0');
            if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - digit) / 10) return false;
            v = v * 10 + digit;
        }
        if (v > UINT64_MAX / units[u].mult) return false;
        v *= units[u].mult;
        if (units[u].decimal && s[len - 1] == 'b') v /= 8;
        *out = v;
        return v > 0;
    }
    return false;
}

/* 0: run; -1: --help was printed; otherwise the usage-error exit status. */
static int parse_args(cv_args *a, quantize_args *q) {
    const char *scheme = NULL, *recipe = NULL, *size = NULL;
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i];
        if (cv_args_flag(a, "--help|-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (cv_args_value(a, "--scheme", &scheme) || cv_args_value(a, "--recipe", &recipe) ||
            cv_args_value(a, "--calibration", &q->calibration) || cv_args_value(a, "--max-shard-size", &size))
            continue;
        if (arg[0] == '-' && arg[1] != '\0') {
            if (!cv_args_unknown(a)) return 2;
        } else if (q->out) {
            return cv_args_error(a, "unexpected argument '%s' (MODEL is '%s', OUT is '%s')", arg, q->model, q->out);
        } else {
            *(q->model ? &q->out : &q->model) = arg;
            a->i++;
        }
    }
    if (a->failed) return 2;
    if (!q->model || !q->out) return cv_args_error(a, "give MODEL and OUT (see cvllm quantize --help)");
    if (!scheme) return cv_args_error(a, "--scheme is required: w8a8 or w8a8_dynamic");
    if (!strcasecmp(scheme, "w8a8")) q->scheme = CV_SCHEME_W8A8;
    else if (!strcasecmp(scheme, "w8a8_dynamic")) q->scheme = CV_SCHEME_W8A8_DYNAMIC;
    else return cv_args_error(a, "unknown --scheme '%s' (choose w8a8 or w8a8_dynamic)", scheme);
    q->has_recipe = recipe != NULL;
    if (recipe && !strcasecmp(recipe, "dense")) q->recipe = CV_RECIPE_DENSE;
    else if (recipe && !strcasecmp(recipe, "moe")) q->recipe = CV_RECIPE_MOE;
    else if (recipe) return cv_args_error(a, "unknown --recipe '%s' (choose dense or moe)", recipe);
    q->max_shard_bytes = 5000000000ull;
    if (size && !parse_size(size, &q->max_shard_bytes))
        return cv_args_error(a, "--max-shard-size '%s' is not a size (5GB, 500MB, 2GiB or a number of bytes)", size);
    if (q->calibration && q->scheme != CV_SCHEME_W8A8)
        return cv_args_error(a, "--calibration only applies to --scheme w8a8 (w8a8_dynamic needs no calibration)");
    return 0;
}

/* ---- checks on MODEL and OUT --------------------------------------------------------------------- */

/* A folder that declares a quantization (loader/quant.h) is refused: this writes float models. */
static int check_not_quantized(const char *model, const char *dir) {
    cv_quant_config *q = NULL;
    if (cv_quant_config_load(dir, NULL, &q) != 0) return fail("cannot quantize %s: %s", model, cv_error_message());
    int rc = q ? fail("%s is already quantized (%s declares it); give a float checkpoint", model,
                      cv_quant_config_origin(q))
               : 0;
    cv_quant_config_free(q);
    return rc;
}

/* OUT must not exist, or be an empty folder. *created: it did not exist. */
static int check_out(const char *out, bool *created) {
    struct stat st;
    *created = stat(out, &st) != 0;
    if (*created) return errno == ENOENT ? 0 : fail("cannot use %s: %s", out, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return fail("%s exists and is not a folder", out);
    DIR *d = opendir(out);
    if (!d) return fail("cannot read %s: %s", out, strerror(errno));
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty ? 0 : fail("%s exists and is not empty; give a new or empty folder", out);
}

/* Removes what this run put in OUT (which was empty or absent before). */
static void remove_output(const char *out, bool created) {
    DIR *d = opendir(out);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *path = cv_xasprintf("%s/%s", out, e->d_name);
        unlink(path);
        free(path);
    }
    if (d) closedir(d);
    if (created) rmdir(out);
}

/* ---- the run ------------------------------------------------------------------------------------- */

typedef struct quantize_job {
    cv_quant_export_options opt;
    char **prompts;                 /* --calibration's, or NULL: the built-in ones */
    size_t n_prompts;
} quantize_job;

/* The options for this model (the recipe defaults to the family's) and the calibration prompts. */
static int plan_job(const quantize_args *q, const cv_model_config *cfg, quantize_job *job) {
    cv_model_family family;
    if (!cv_model_family_of(cfg->architecture, &family))
        return fail("architecture %s is not supported (supported: %s)", cfg->architecture,
                    cv_model_supported_architectures());
    const bool dense = family == CV_FAMILY_DENSE || family == CV_FAMILY_QWEN3_5_DENSE;
    job->opt.scheme = q->scheme;
    job->opt.recipe = q->has_recipe ? q->recipe : dense ? CV_RECIPE_DENSE : CV_RECIPE_MOE;
    job->opt.max_shard_bytes = q->max_shard_bytes;
    job->opt.deq_scale_i64 = cfg->torch_dtype == CV_DTYPE_F16;
    if (!q->calibration) return 0;
    if (cv_read_prompts_file(q->calibration, &job->prompts, &job->n_prompts)) return fail("%s", cv_error_message());
    return job->n_prompts ? 0 : fail("calibration file %s holds no prompts", q->calibration);
}

static int run(const quantize_args *q, const char *dir, const cv_model_config *cfg, quantize_job *job) {
    cv_checkpoint *ck = NULL;
    if (cv_checkpoint_open(dir, &ck)) return fail("%s", cv_error_message());
    bool created = false;
    int rc = check_out(q->out, &created);
    cv_threadpool *pool = rc ? NULL : cv_threadpool_create(0);
    cv_act_ranges *ranges = NULL;
    if (!rc && job->opt.scheme == CV_SCHEME_W8A8) {
        ranges = cv_act_ranges_create();
        size_t n = 0;
        while (cv_calib_default_prompts[n]) n++;
        const char *const *prompts = job->prompts ? (const char *const *)job->prompts : cv_calib_default_prompts;
        if (cv_calibrate(dir, cfg, prompts, job->prompts ? job->n_prompts : n, pool, ranges))
            rc = fail("%s", cv_error_message());
    }
    job->opt.ranges = ranges;
    job->opt.pool = pool;
    cv_quant_export_stats stats = {0};
    bool wrote = !rc;
    if (!rc && cv_quant_export(dir, ck, &job->opt, q->out, &stats)) rc = fail("%s", cv_error_message());
    if (rc && wrote) remove_output(q->out, created);
    if (!rc && stats.n_group_ranges)
        cv_info("quantize", "%zu routed experts that no calibration token reached take the range of all experts of "
                "their layer and projection", stats.n_group_ranges);
    if (!rc)
        printf("Wrote %s: %zu linears quantized to %s (%s recipe), %zu tensors, %.1f MB in %d shard%s\n", q->out,
               stats.n_linears, cv_linear_scheme_name(job->opt.scheme), cv_quant_recipe_name(job->opt.recipe),
               stats.n_tensors, (double)stats.bytes / 1e6, stats.n_shards, stats.n_shards == 1 ? "" : "s");
    cv_act_ranges_free(ranges);
    cv_threadpool_free(pool);
    cv_checkpoint_close(ck);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    quantize_args q = {0};
    cv_args a;
    int rc = cv_args_init(&a, "quantize", argc, argv);
    if (rc == 0) rc = parse_args(&a, &q);
    char *dir = NULL;
    cv_model_config cfg = {0};
    bool have_cfg = false;
    if (rc == 0 && cv_resolve_model(q.model, NULL, true, &dir) != 0) rc = fail("%s", cv_error_message());
    if (rc == 0) {
        have_cfg = cv_model_config_load(dir, NULL, &cfg) == 0;
        if (!have_cfg) rc = fail("%s", cv_error_message());
    }
    if (rc == 0) rc = check_not_quantized(q.model, dir);
    quantize_job job = {0};
    if (rc == 0) rc = plan_job(&q, &cfg, &job);
    if (rc == 0) rc = run(&q, dir, &cfg, &job);
    cv_free_prompts(job.prompts, job.n_prompts);
    if (have_cfg) cv_model_config_free(&cfg);
    free(dir);
    cv_args_free(&a);
    return rc < 0 ? 0 : rc;
}
