/*
 * dispatch.c — choosing the instruction-set path once, at first kernel call.
 *
 * The best path the CPU supports wins (AVX-512 needs F/BW/VL/DQ, AVX2 needs FMA, F16C and BMI2 too:
 * exactly the flags each ISA's folder is compiled with, CMakeLists.txt),
 * unless CVLLM_ISA names another; an unknown or unsupported name is reported once and ignored
 * rather than failing, since it is a tuning knob, not input. The choice is a plain pointer read on
 * every kernel call: cheaper than any indirection through the thread pool and trivially
 * overridable by tests through cv_isa_force().
 *
 * AVX512-VNNI is an extension on top of the AVX-512 path, not an ISA of its own: the int8 kernels
 * use it when the CPU has it (formats.h, cv_format_gemm), and tests switch it off to run the plain
 * AVX-512 int8 kernel, which every AVX-512 CPU must still get exactly right.
 *
 * AVX512-BF16 is such an extension too, but using it changes the numbers (bf16 activations), so it
 * is a choice the models make (cv_linear_bf16_input) and it is made on speed: vdpbf16ps does twice
 * the multiply-adds of an f32 FMA per instruction, but some cores issue it at half the FMA rate,
 * where it gains nothing. The first question times both instructions (register-only loops, under 2 ms,
 * avx512/panels_bf16_dot.c) and answers yes from 1.3× the f32 FMA rate (AMD Zen 4/5: ~2×); the
 * answer and the measured ratio are logged once. It needs the AVX-512 path to be the active one.
 *
 * AMX (tile products: tdpbf16ps, tdpbssd) is one more extension on the AVX-512 path. Its tile state
 * is large, so Linux hands it to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM); the
 * first question asks for it, and a CPU, kernel or VM that says no runs the AVX-512 kernels. Where
 * it is granted, bf16 compute always uses it — a tile product does 16× the multiply-adds of an f32
 * FMA — and the int8 formats do too. CVLLM_AMX=0 switches it off (a tuning knob, like CVLLM_ISA).
 *
 * Whether a decode tile asks for the lines ahead of its weight streams (software prefetch, formats.h
 * cv_panel_ahead) depends on the CPU's own prefetchers: a one-token product reads each thread's
 * share as a few long streams, which AMD's follow by themselves, and there the asks only took load
 * slots and miss buffers (Zen 5, 2 threads: the 0.6B's int8 decode GEMVs 37-38 → 43-45 GB/s, the
 * bf16 lm_head shape +3-6 %, docs/performance.md); other CPUs keep them (not measured without).
 * CVLLM_STREAM_ASKS=0|1 overrides (a tuning knob).
 */
#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/formats.h"
#include "kernels/kernels.h"

static const cv_cpu_ops *const ops_by_isa[CV_ISA_COUNT] = {
    [CV_ISA_SCALAR] = &cv_cpu_ops_scalar,
    [CV_ISA_AVX2] = &cv_cpu_ops_avx2,
    [CV_ISA_AVX512] = &cv_cpu_ops_avx512,
};

static const cv_cpu_ops *active_ops;

/* clang 14's __builtin_cpu_supports does not know "f16c": ask CPUID (leaf 1, ECX bit 29). */
static bool has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

bool cv_isa_supported(cv_isa isa) {
    __builtin_cpu_init();
    switch (isa) {
    case CV_ISA_SCALAR:
        return true;
    case CV_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
               has_f16c();
    case CV_ISA_AVX512:
        return cv_isa_supported(CV_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    default:
        return false;
    }
}

const char *cv_isa_name(cv_isa isa) {
    static const char *const names[CV_ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < CV_ISA_COUNT ? names[isa] : "unknown";
}

int cv_isa_from_name(const char *name) {
    for (int i = 0; i < CV_ISA_COUNT; i++)
        if (strcmp(name, cv_isa_name((cv_isa)i)) == 0) return i;
    return -1;
}

static cv_isa best_isa(void) {
    for (int i = CV_ISA_COUNT - 1; i > 0; i--)
        if (cv_isa_supported((cv_isa)i)) return (cv_isa)i;
    return CV_ISA_SCALAR;
}

static cv_isa isa_from_environment(void) {
    cv_isa best = best_isa();
    const char *env = getenv("CVLLM_ISA");
    if (!env || !*env) return best;
    int isa = cv_isa_from_name(env);
    if (isa < 0) {
        cv_warn("kernels", "CVLLM_ISA=%s is not one of avx512|avx2|scalar; using %s", env, cv_isa_name(best));
        return best;
    }
    if (!cv_isa_supported((cv_isa)isa)) {
        cv_warn("kernels", "CVLLM_ISA=%s is not supported by this CPU; using %s", env, cv_isa_name(best));
        return best;
    }
    return (cv_isa)isa;
}

const cv_cpu_ops *cv_cpu_ops_active(void) {
    const cv_cpu_ops *ops = __atomic_load_n(&active_ops, __ATOMIC_ACQUIRE);
    if (!ops) {
        ops = ops_by_isa[isa_from_environment()];
        __atomic_store_n(&active_ops, ops, __ATOMIC_RELEASE);
    }
    return ops;
}

cv_isa cv_isa_active(void) {
    const cv_cpu_ops *ops = cv_cpu_ops_active();
    for (int i = 0; i < CV_ISA_COUNT; i++)
        if (ops_by_isa[i] == ops) return (cv_isa)i;
    return CV_ISA_SCALAR;
}

int cv_isa_force(cv_isa isa) {
    if ((unsigned)isa >= CV_ISA_COUNT) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "unknown ISA %d", (int)isa);
    if (!cv_isa_supported(isa))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "this CPU cannot run the %s kernels", cv_isa_name(isa));
    __atomic_store_n(&active_ops, ops_by_isa[isa], __ATOMIC_RELEASE);
    return 0;
}

static bool cpu_has_vnni(void) {
    __builtin_cpu_init();
    return cv_isa_supported(CV_ISA_AVX512) && __builtin_cpu_supports("avx512vnni");
}

static int vnni_state; /* 0: not decided yet, 1: used, -1: not used */

bool cv_cpu_vnni(void) {
    int s = __atomic_load_n(&vnni_state, __ATOMIC_ACQUIRE);
    if (!s) {
        s = cpu_has_vnni() ? 1 : -1;
        __atomic_store_n(&vnni_state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

int cv_cpu_vnni_enable(bool on) {
    if (on && !cpu_has_vnni()) return cv_fail(CVLLM_ERR_UNSUPPORTED, "this CPU has no AVX512-VNNI");
    __atomic_store_n(&vnni_state, on ? 1 : -1, __ATOMIC_RELEASE);
    return 0;
}

static int asks_state; /* 0: not decided yet, 1: ask, -1: do not */
static pthread_once_t asks_once = PTHREAD_ONCE_INIT;

/* Once (pthread_once): the first question comes from the pool's threads at once. */
static void decide_asks(void) {
    __builtin_cpu_init();
    const char *env = getenv("CVLLM_STREAM_ASKS");
    bool ask = !__builtin_cpu_is("amd");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) ask = env[0] == '1';
    else if (env && *env) cv_warn("kernels", "CVLLM_STREAM_ASKS=%s is not 0 or 1; ignored", env);
    cv_info("kernels", "decode weight streams: %s", ask ? "software prefetch 1 KiB ahead of each stream"
                                                       : "the hardware prefetchers alone (no software prefetch)");
    __atomic_store_n(&asks_state, ask ? 1 : -1, __ATOMIC_RELEASE);
}

bool cv_cpu_stream_asks(void) {
    int s = __atomic_load_n(&asks_state, __ATOMIC_ACQUIRE);
    if (!s) {
        pthread_once(&asks_once, decide_asks);
        s = __atomic_load_n(&asks_state, __ATOMIC_ACQUIRE);
    }
    return s > 0;
}

void cv_cpu_stream_asks_enable(bool on) {
    pthread_once(&asks_once, decide_asks); /* a later first question must not undo this */
    __atomic_store_n(&asks_state, on ? 1 : -1, __ATOMIC_RELEASE);
}

/* AMX-BF16, AMX-TILE, AMX-INT8: CPUID leaf 7 subleaf 0, EDX bits 22, 24, 25; the OS saves the tile
 * state (XCR0 bits 17 and 18); and Linux grants it to this process (XFEATURE_XTILEDATA = 18). */
static bool amx_usable(const char **why) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (3u << 24 | 1u << 22)) != (3u << 24 | 1u << 22)) {
        *why = "this CPU has no AMX-TILE/AMX-BF16/AMX-INT8";
        return false;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        *why = "the OS does not enable the AMX tile state";
        return false;
    }
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        *why = "the kernel refused this process the AMX tile state";
        return false;
    }
    return true;
}

static int amx_state; /* 0: not decided yet, 1: used, -1: not used */
static bool amx_granted; /* the CPU has AMX and this process may use it (asked once) */

static int decide_amx(void) {
    const char *why = NULL;
    amx_granted = cv_isa_supported(CV_ISA_AVX512) && amx_usable(&why);
    const char *env = getenv("CVLLM_AMX");
    if (amx_granted && env && strcmp(env, "0") == 0) why = "switched off by CVLLM_AMX=0";
    if (amx_granted && !why) cv_info("kernels", "AMX: bf16 and int8 GEMMs on tile products (tdpbf16ps, tdpbssd)");
    else cv_info("kernels", "AMX: not used (%s)", why ? why : "the CPU has no AVX-512");
    return amx_granted && !why ? 1 : -1;
}

static int amx_decided(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (!s) {
        s = decide_amx();
        __atomic_store_n(&amx_state, s, __ATOMIC_RELEASE);
    }
    return s;
}

bool cv_cpu_amx(void) { return cv_isa_active() == CV_ISA_AVX512 && amx_decided() > 0; }

int cv_cpu_amx_enable(bool on) {
    amx_decided();
    if (on && !amx_granted) return cv_fail(CVLLM_ERR_UNSUPPORTED, "this CPU or OS gives no AMX to this process");
    __atomic_store_n(&amx_state, on ? 1 : -1, __ATOMIC_RELEASE);
    return 0;
}

/* A CPUID leaf-7 feature bit of an AVX-512 extension (clang 14's __builtin_cpu_supports lacks their
 * names), asked once per feature (*known: 0 not asked yet, 1 has it, -1 has not), as the bf16
 * rounding asks per row. reg: 0 for EAX, 2 for ECX. */
static bool leaf7_feature(int *known, unsigned subleaf, int reg, unsigned bit) {
    int k = __atomic_load_n(known, __ATOMIC_RELAXED);
    if (!k) {
        unsigned r[4];
        k = cv_isa_supported(CV_ISA_AVX512) && __get_cpuid_count(7, subleaf, &r[0], &r[1], &r[2], &r[3]) &&
                    (r[reg] & (1u << bit))
                ? 1
                : -1;
        __atomic_store_n(known, k, __ATOMIC_RELAXED);
    }
    return k > 0;
}

/* AVX512-BF16: leaf 7 subleaf 1, EAX bit 5. */
bool cv_cpu_avx512_bf16(void) {
    static int known;
    return leaf7_feature(&known, 1, 0, 5);
}

/* AVX512-VBMI: leaf 7 subleaf 0, ECX bit 1 (Cooper Lake has AVX512-BF16 without it). */
bool cv_cpu_avx512_vbmi(void) {
    static int known;
    return leaf7_feature(&known, 0, 2, 1);
}

/* From this speed-up of the multiply-add rate on, bf16 inputs are worth their rounding. */
#define BF16_DOT_MIN_SPEEDUP 1.3

static int bf16_dot_state; /* 0: not decided yet, 1: used, -1: not used */

static int decide_bf16_dot(void) {
    if (cv_cpu_amx()) {
        cv_info("kernels", "bf16 compute: bf16 inputs through AMX tdpbf16ps");
        return 1;
    }
    if (!cv_cpu_avx512_bf16()) {
        cv_info("kernels", "bf16 compute: f32 FMA on widened bf16 weights (this CPU has no AVX512-BF16)");
        return -1;
    }
    const double speedup = cv_avx512_bf16_dot_speedup();
    const bool use = speedup >= BF16_DOT_MIN_SPEEDUP;
    cv_info("kernels", "bf16 compute: %s (vdpbf16ps measured at %.2fx the multiply-adds per second of f32 FMA; "
            "used from %.1fx)", use ? "bf16 inputs through AVX512-BF16 vdpbf16ps" : "f32 FMA on widened bf16 weights",
            speedup, BF16_DOT_MIN_SPEEDUP);
    return use ? 1 : -1;
}

bool cv_cpu_bf16_dot(void) {
    return __atomic_load_n(&bf16_dot_state, __ATOMIC_ACQUIRE) > 0 && cv_isa_active() == CV_ISA_AVX512;
}

bool cv_linear_bf16_input(void) {
    if (cv_isa_active() != CV_ISA_AVX512) return false;
    int s = __atomic_load_n(&bf16_dot_state, __ATOMIC_ACQUIRE);
    if (!s) {
        s = decide_bf16_dot();
        __atomic_store_n(&bf16_dot_state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

int cv_cpu_bf16_dot_enable(bool on) {
    if (on && !cv_cpu_avx512_bf16()) return cv_fail(CVLLM_ERR_UNSUPPORTED, "this CPU has no AVX512-BF16");
    __atomic_store_n(&bf16_dot_state, on ? 1 : -1, __ATOMIC_RELEASE);
    return 0;
}
