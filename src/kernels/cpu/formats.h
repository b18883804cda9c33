/*
 * formats.h — the weight-format traits table behind cv_weight and cv_linear (internal to src/kernels).
 *
 * Every cv_wformat has one entry (cv_formats[]): its layout constants, how a checkpoint matrix is
 * packed into it, and its GEMM micro-kernel per ISA — in the way ggml's type_traits_cpu works, so
 * a new format or ISA is a new entry, not a new `if` inside every kernel. The blocked, threaded
 * drivers in matmul.c are written once against these entries.
 *
 * Packed formats share one layout: rows in panels of CV_PANEL_ROWS, each panel's codes stored as
 * k groups (k_group columns of all 16 rows, group_bytes bytes, so one vector load holds 16 outputs
 * × k_group inputs), all panels' codes first, then per panel aux_bytes of the format's own data
 * (scales, biases). The micro-kernels accumulate 16 outputs lane-wise per panel with no
 * horizontal sums; a tile is up to mr tokens × nr panels of accumulators.
 *
 * The kernels of each ISA live in its folder (ref/, avx2/, avx512/) and are named
 * cv_<isa>_<kernel>; those for the AVX512-VNNI and AVX512-BF16 extensions sit in avx512/ with the
 * function-level target attribute, chosen at run time when the CPU has them (cv_format_gemm,
 * cv_format_gemm_bf16).
 *
 * A format may also read bf16 activations (cv_act.bf16) with a kernel of its own: BF16_PANELS and
 * FP8_PANELS in bf16 compute, through vdpbf16ps. The BF16_PANELS and I8_PANELS layouts are also the
 * B tiles of AMX's tdpbf16ps and tdpbssd, so on CPUs with AMX their kernels are tile products
 * (amx/), chosen before the AVX-512 ones (cv_format_gemm, cv_format_gemm_bf16). There a format with
 * no tile kernel keeps its f32 input: bf16 compute is on for AMX's sake, and those Xeons issue
 * vdpbf16ps at half the FMA rate.
 */
#ifndef CV_FORMATS_H
#define CV_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* Row-major micro-tile: y[i·ldy + j] = Σ_k x[i·ldx + k] · w[j·ldw + k] for i < mr, j < nr. */
typedef void (*cv_rows_fn)(const void *w, int64_t ldw, const float *x, int64_t ldx, float *y, int64_t ldy, int mr,
                           int nr, int64_t k);

/*
 * One panel micro-tile over one k block: tokens i < mr, outputs c < n_out (≤ 16·np) of panels
 * 0..np-1 (the panel of output c is c/16), columns [k0, k0 + k) of the weight.
 *   float inputs:       y[i·ldy + c] (+)= Σ_kk x_i[kk] · w(c, k0 + kk)
 *   int8-input formats: the int32 dot product; partial sums of earlier k blocks are kept in y as
 *                       int32 bits, and the last block applies the format's epilogue.
 * k0 is a multiple of the k block (kblock groups of k_group columns), so every block but the last
 * is whole groups.
 */
typedef struct cv_panel_tile {
    const uint8_t *w;     /* panel 0's codes, at k0's group */
    int64_t panel_stride; /* bytes from one panel's codes to the next's */
    const uint8_t *next;  /* panel 0's codes of the tile the walk reaches next, at its first group;
                           * NULL: none known, or it is this tile's next k block */
    const uint8_t *aux;   /* panel 0's aux data */
    int64_t aux_stride;   /* bytes from one panel's aux to the next's */
    int64_t k0, k;
    const void *x;        /* token 0's input at column k0: f32 values, bf16 values or int8 codes
                           * (bf16 and int8 rows zero past cols) */
    int64_t ldx;          /* between token rows, in elements of x */
    const float *x_scale; /* int8 input: token 0's scale, per token; NULL: 1 */
    bool first, last;     /* the first k block (else continue from y); the last one */
    bool ask;             /* a decode tile on a CPU whose decode tiles ask ahead (cv_cpu_stream_asks) */
    float *y;
    int64_t ldy;
    int mr, np, n_out;
} cv_panel_tile;

typedef void (*cv_panel_fn)(const cv_panel_tile *t);

/* A tile of at most CV_STREAM_TOKENS tokens (a decode step) reads each weight byte once, from
 * memory. Where cv_cpu_stream_asks() says so (t->ask), its kernel asks (prefetches) CV_PANEL_AHEAD
 * bytes ahead in each panel it streams, on top of the hardware prefetchers (+12-15 % GEMV bandwidth
 * on the lm_head shape when a tile's panels were short streams side by side); the driver asks for
 * the next tile's aux data as the tile starts, on every CPU. */
enum { CV_STREAM_TOKENS = 2, CV_PANEL_AHEAD = 1024 };

/* What panel j of tile t asks for while it reads byte `at` of its k range (`span` bytes a panel):
 * CV_PANEL_AHEAD further on in the panel, or past its end the same place in panel j of the next tile.
 * The panels of a tile lie side by side, so past panel 0's end is panel 1, which is being read
 * already: asking there left the next tile's panels 1 and 2 to start cold, and the next tile's own
 * place measured +9 % on the int8 lm_head shape. A hint only: an address past the weight's end is
 * never read, and a prefetch does not fault. */
static inline const char *cv_panel_ahead(const cv_panel_tile *t, int j, int64_t at, int64_t span) {
    const int64_t a = at + CV_PANEL_AHEAD;
    return (const char *)(a < span || !t->next ? t->w + j * t->panel_stride + a
                                               : t->next + j * t->panel_stride + (a - span));
}

/* A GEMM micro-kernel of one format on one ISA and its largest tile. */
typedef struct cv_gemm_kernel {
    cv_rows_fn rows;   /* row-major formats */
    cv_panel_fn panel; /* packed formats */
    int mr, nr;        /* tokens × weight rows (row-major) or tokens × panels (packed) */
    int kblock;        /* packed: groups per prefill k block where the format's kblock does not suit
                        * this kernel; 0: the format's */
    int token_block;   /* packed: tokens per prefill block (weights re-read once per block); 0: 64 */
    bool vbmi;         /* needs AVX512-VBMI (byte permutes) besides its ISA */
} cv_gemm_kernel;

/* Packing: the stacked parts and the destination, for a format's pack_panel. */
typedef struct cv_pack_ctx {
    const cv_weight_part *parts;
    int n_parts;
    int64_t rows, cols, panels;
    uint8_t *codes;     /* panel p's codes at codes + p·panel_bytes */
    int64_t panel_bytes;
    uint8_t *aux;       /* panel p's aux at aux + p·aux_bytes */
    int64_t aux_bytes;
} cv_pack_ctx;

/* Where row r of the stack comes from: its part and row within it; false for a padding row. */
bool cv_pack_source_row(const cv_pack_ctx *c, int64_t r, int *part, int64_t *row);

typedef struct cv_format_traits {
    const char *name;
    cv_dtype dtype;   /* the checkpoint dtype a view holds, or the one packed from */
    bool packed;
    bool int8_input;  /* reads cv_act.i8 (zero-padded to cv_act_i8_stride) */
    int k_group;      /* packed: columns per group */
    int group_bytes;  /* packed: bytes of one group of one panel */
    int kblock;       /* packed: groups per prefill cache block (a few panels' worth ≈ 24 KiB) */
    int64_t (*aux_bytes)(int64_t cols);                            /* packed: per panel */
    int (*check)(const cv_weight_part *part);                      /* packed: its scales and sizes, or NULL */
    /* packed: writes a panel's codes and aux; returns −1, or a stacked row holding bad_code */
    int64_t (*pack_panel)(const cv_pack_ctx *c, int64_t panel);
    const char *bad_code;                                          /* what pack_panel refuses, or NULL */
    void (*row)(const cv_weight *w, int64_t r, float *out);        /* row r as f32; NULL: not defined */
    const cv_gemm_kernel *gemm[CV_ISA_COUNT];
    const cv_gemm_kernel *gemm_vnni; /* replaces gemm[CV_ISA_AVX512] on CPUs with AVX512-VNNI */
    /* reads bf16 rows (cv_act.bf16) instead of f32: AVX-512 with AVX512-BF16, where
     * cv_linear_bf16_input() and AMX is not used; NULL: the format has none */
    const cv_gemm_kernel *gemm_bf16_dot;
    /* AMX tile products, on CPUs where cv_cpu_amx(): replaces gemm_bf16_dot (bf16 input) or
     * gemm_vnni (int8 input); NULL: none */
    const cv_gemm_kernel *gemm_amx;
} cv_format_traits;

extern const cv_format_traits *const cv_formats[CV_WFORMAT_COUNT];

/* The micro-kernel of format f on the active ISA for a product of m tokens. */
const cv_gemm_kernel *cv_format_gemm(cv_wformat f, int64_t m);

/* The micro-kernel of format f for bf16 activations on this CPU, or NULL: none, none this CPU runs,
 * or cv_linear_bf16_input() is false (not decided yet counts as false, so kernels never time the
 * CPU). Weights of f read bf16 rows exactly where this is not NULL (cv_wformat_bf16_input). */
const cv_gemm_kernel *cv_format_gemm_bf16(cv_wformat f);

/* cv_linear_bf16_input() as decided, without deciding: false until it has been asked. */
bool cv_cpu_bf16_dot(void);
/* vdpbf16ps multiply-adds per second over vfmadd231ps's on this core (register-only loops, under 2 ms;
 * avx512/panels_bf16_dot.c). Only on CPUs with AVX512-BF16. */
double cv_avx512_bf16_dot_speedup(void);

/* The CPU has AVX512-BF16 (vdpbf16ps, vcvtneps2bf16), whether or not bf16 compute uses it. */
bool cv_cpu_avx512_bf16(void);
/* The CPU has AVX512-VBMI (vpermb, vpermi2b, vpermt2b). */
bool cv_cpu_avx512_vbmi(void);

/* The CPU has AVX512-VNNI and its use is not switched off (cv_cpu_vnni_enable). */
bool cv_cpu_vnni(void);
/* Tests switch the VNNI kernels off to run the plain AVX-512 ones on a CPU that has both (not while
 * kernels run). Switching on a CPU without VNNI: CVLLM_ERR_UNSUPPORTED. */
int cv_cpu_vnni_enable(bool on);

/* Decode tiles ask ahead in their weight streams (software prefetch): not on AMD CPUs, whose
 * prefetchers follow the streams alone; CVLLM_STREAM_ASKS=0|1 overrides. Decided and logged at the
 * first question. Tests and benchmarks switch it (not while kernels run); the bits never change. */
bool cv_cpu_stream_asks(void);
void cv_cpu_stream_asks_enable(bool on);

/* The CPU has AMX (tiles, bf16 and int8 products), this process was granted the tile state, AVX-512
 * is the active path, and AMX is not switched off (CVLLM_AMX=0, cv_cpu_amx_enable). Decided and
 * logged at the first question. */
bool cv_cpu_amx(void);
/* Tests and benchmarks switch the AMX kernels off to run the AVX-512 ones on a CPU that has both
 * (not while kernels run). Switching on a CPU without AMX: CVLLM_ERR_UNSUPPORTED. */
int cv_cpu_amx_enable(bool on);

/* The format entries (format_*.c) and the ISA kernels they point to. */
extern const cv_format_traits cv_format_f32, cv_format_bf16, cv_format_f16, cv_format_bf16_panels,
    cv_format_i8_panels, cv_format_fp8_panels;

extern const cv_gemm_kernel cv_ref_rows_f32, cv_ref_rows_bf16, cv_ref_rows_f16, cv_ref_panels_bf16,
    cv_ref_panels_i8, cv_ref_panels_fp8;
extern const cv_gemm_kernel cv_avx2_rows_f32, cv_avx2_rows_bf16, cv_avx2_rows_f16, cv_avx2_panels_bf16,
    cv_avx2_panels_i8, cv_avx2_panels_fp8;
extern const cv_gemm_kernel cv_avx512_rows_f32, cv_avx512_rows_bf16, cv_avx512_rows_f16, cv_avx512_panels_bf16,
    cv_avx512_panels_i8, cv_avx512_panels_i8_vnni, cv_avx512_panels_fp8, cv_avx512_panels_bf16_dot,
    cv_avx512_panels_fp8_dot;
extern const cv_gemm_kernel cv_amx_panels_bf16, cv_amx_panels_i8;

/* ---- per-format layout details shared by packing and the kernels ---------------------------- */

/* I8_PANELS aux of one panel: 16 f32 row scales, then 16 int32 biases, then 16 int32 code sums. */
enum { CV_I8_AUX_SCALE = 0, CV_I8_AUX_BIAS = 16, CV_I8_AUX_SUM = 32, CV_I8_AUX_WORDS = 48 };

/* The I8_PANELS epilogue, in this order on every ISA so that all give the same bits: the int32 sum
 * plus the bias (wrapping as the SIMD add does), converted to f32 (round to nearest even), times
 * the row's scale, times the token's. */
static inline float cv_i8_dequant(int32_t acc, int32_t bias, float scale, float x_scale) {
    float v = (float)(int32_t)((uint32_t)acc + (uint32_t)bias);
    v = v * scale;
    return v * x_scale;
}

/* FP8_PANELS aux of one panel: one f32 scale per CV_FP8_SCALE_COLS (kernels.h) columns, times 256
 * (the kernels widen a code to its value / 256, see cv_fp8_f16_bits). */

/* The f16 bit pattern of an e4m3fn code's value / 256, exact for every non-NaN code (subnormals
 * included): the code sign-extended to 16 bits, shifted left by 7, with bit 14 cleared. The SIMD
 * kernels do the same per lane (vpmovsxbw, vpsllw, vpand) before vcvtph2ps. */
static inline uint16_t cv_fp8_f16_bits(uint8_t code) {
    return (uint16_t)(((uint16_t)(int16_t)(int8_t)code << 7) & 0xbf80u);
}

#endif
