// Integer-dot linear layers for x86 CPUs with AVX2 (built and loaded by engine/kernels.py).
//
// Variants: this one file is compiled once per instruction set (engine/kernels.py picks
// the best one the CPU runs; ANVE_VARIANT names it). Plain AVX2 (-mavx2 -mfma -mf16c)
// sums int8 products with maddubs/madd. AVX-VNNI (also -mavxvnni) sums them with 256-bit
// vpdpbusd in the same float order: its outputs are the AVX2 build's, bit for bit.
// AVX-512 (also -mavx512f -mavx512bw -mavx512vl -mavx512vnni) runs the q4, q8, q4k and
// q6k loops on 512-bit vpdpbusd, up to 16 rows per pass over the weights (32 vector
// registers), with activations stored in the orders its 64-byte loads want (group_low,
// slot, paired_at) and a float order of its own (the last bits differ from AVX2's). AMX (also
// -mamx-tile -mamx-int8; the library asks the OS for tile data when it loads, and
// anve_qdot_ready says whether it got it) is the AVX-512 build whose q4k calls of 32 rows
// or more (prompt reading) take their exact 32-group sums from AMX-INT8 tiles (all rows
// in one pass over the weights) and then repeat the AVX-512 loop's float steps: it
// returns the avx512 build's bits, bit for bit. Attention and the elementwise pieces
// are the same 256-bit code in every build. Every integer sum is exact in every variant,
// and each variant keeps the promise below on its own.
//
// Contract: y[m, n] = sum_k x[m, k] * w[n, k] for M rows of float32 activations, where
// the activations are first rounded per group of 32 to int8 codes with one float scale
// (dx = max|x| / 127), as llama.cpp does, and every group's dot product is exact integer
// arithmetic. Each output element depends only on its own row of x: the work and the
// order of every floating-point operation for row m are the same whatever M is, so a
// k-row call returns bit-for-bit what k one-row calls return.
//
// Weights:
//   q4: 4-bit codes 0..15, 16 bytes per group of 32 (byte j: element j in the low
//       nibble, element 16 + j in the high one), and per group a float16 scale and
//       float16 offset (two [N, K / 32] arrays): w = code * scale + offset.
//   q4k: Q4_K's own form: 4-bit codes, 128 bytes per super-block of 256 inputs taken in
//       kernel order (see kernel_position: what lets 8 groups share one scale multiply),
//       per 256 inputs float16 d and dmin, per 32 a 6-bit scale sc and min mn (uint8
//       each), the factors of two super-blocks in one record (q4k_record):
//       w = d*sc*code - dmin*mn. Its activations are rounded per 256 inputs
//       instead (as llama.cpp's Q8_K) and stored in the same kernel order.
//   q6k: Q6_K's own form, its codes as int8 (-32..31, one byte each: the 256-bit loops
//       run it faster than 6-bit codes) in kernel order, an int8 scale per 16 inputs and
//       float32 d per 256: w = d * sc * code. Activations rounded per 256 inputs.
//   q6kp: the same weights with the codes in 6 bits (see Q6KPWeights): the AVX-512 loop
//       unpacks them for less than the memory they save; every build returns q6k's bits.
//   q8: int8 codes per output row with one float scale: w = code * scale.
// Threads: OpenMP over output features (the process's one OpenMP runtime, torch's), in
// tiles of 16 (each tile's rows all in one call: the amx tiles' unit).
// Rows: any number per call; the AVX-512 loops take up to 16 rows per pass over the
// weights (8 elsewhere), more in balanced passes; amx's q4k tiles take all rows in one.
//
// Row attention (anve_row_attention): softmax(q . k^T * scaling) . v in float32 for T
// query rows, each over its own causal prefix of the cache, up to 16 rows and the query
// heads of one key/value head per task (attend_heads: the cache read once a span for all
// of them), every sum in a fixed order: a row's output never depends on how many rows came
// with it, nor on how rows and heads were grouped, like the linear kernels above. With a
// draft tree (a mask per row: bit j set where row t sees new row j, its ancestors and
// itself) a row sees the cache before the step and those rows, and gets bit for bit what
// a one-row step gets once its ancestors sit contiguously before it (the positions are
// visited in the same order).
//
// Decoder step (anve_decoder_step): a whole Llama/Qwen2 step of T new tokens (any T for
// causal rows, e.g. 64 a call when reading a prompt; at most 31 with a draft tree)
// through every layer in one call (RMSNorm, q/k/v, rotary, the KV cache write,
// row attention, o, residual, RMSNorm, gate/up, SiLU * up, down, residual), built from
// the pieces above and row-wise elementwise code with no threads' say in any sum, so it
// keeps their promise: row t of a T-row step is bit-identical to a one-row step.
// anve_decoder_step_seqs does the same for rows of several sequences (batched decoding),
// each row over its own sequence's cache: bit-identical to that sequence's one-row step.

#include <immintrin.h>
#include <omp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define ANVE_AVX512 1
#define ANVE_VNNI 1
#define ANVE_AMX 1
#define ANVE_VARIANT "amx"
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define ANVE_AVX512 1
#define ANVE_VNNI 1
#define ANVE_VARIANT "avx512"
#elif defined(__AVXVNNI__)
#define ANVE_AVX512 0
#define ANVE_VNNI 1
#define ANVE_VARIANT "avxvnni"
#else
#define ANVE_AVX512 0
#define ANVE_VNNI 0
#define ANVE_VARIANT "avx2"
#endif

#ifndef ANVE_AMX
#define ANVE_AMX 0
#endif
#if ANVE_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int GROUP = 32;
// Rows per pass over the weights (as many as the row accumulators fit in registers);
// more rows go in balanced passes (9 rows: 5 + 4, never 8 + 1).
constexpr int MAX_M = ANVE_AVX512 ? 16 : 8;

#if ANVE_AMX
// Rows at a time per set of tiles; more rows take more sets over the same prepared weights.
constexpr int AMX_ROWS = 16;
// Calls of at least this many rows take their q4k integer sums from tiles (fewer: the
// AVX-512 loop, whose float steps the tile loop repeats exactly); measured best, as
// is leaving q6k on the AVX-512 loop (see docs/kernels-amx.md).
constexpr int AMX_FROM = 32;
inline int amx_rows(int M) { return M < AMX_ROWS ? M : AMX_ROWS; }
// Rows of the tiles' codes a call stores: whole sets of 16 (none below AMX_FROM rows).
inline int amx_padded(int M) { return M < AMX_FROM ? 0 : (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS; }
#endif

#if ANVE_VNNI
// acc + the four-byte dot products of u (unsigned) and s (signed) per int32 lane: what
// maddubs + madd compute, in one instruction and without the 16-bit intermediate.
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if ANVE_AVX512
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#endif

struct QuantRows {
    int8_t *codes;  // [M, K], groups paired (pair_low) or in fours (group_low)
    float *scale;   // [M, G], dx per group
    float *sum;     // [M, G], dx * sum of the group's codes
    int8_t *flipped;  // [M, K], codes ^ 0x80 (codes + 128 as unsigned; AVX-512 only)
};

// The int8 scale of a block of n activations: max|x| / 127.
inline float block_scale(const float *src, int n) {  // n a multiple of 8
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 top = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8)
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m) / 127.0f;
}

// Round one group of 32 activations to int8 codes at 1 / d; returns the codes' sum.
inline int round_group(const float *src, float d, int8_t *dst) {
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    int total = 0;
    for (int i = 0; i < GROUP; ++i) {
        const int c = (int)nearbyintf(src[i] * inv);
        dst[i] = (int8_t)c;
        total += c;
    }
    return total;
}

// Where group g's 32 activation codes go in a row rounded per 32: groups pair up, (2i, 2i + 1)
// as [2i: 0..15][2i + 1: 0..15][2i: 16..31][2i + 1: 16..31], the order in which one 32-byte
// load of the two groups' q4 codes (16 bytes each) unpacks; a last unpaired group keeps
// input order. Offsets of the group's first and second 16 codes in the row.
inline int64_t pair_low(int g, int G) {
    return (g | 1) < G ? (int64_t)(g & ~1) * GROUP + (g & 1) * 16 : (int64_t)g * GROUP;
}
inline int64_t pair_high(int g, int G) { return pair_low(g, G) + ((g | 1) < G ? GROUP : 16); }

// The AVX-512 build groups four instead, (4i .. 4i + 3) as [4i: 0..15][4i + 1: 0..15]
// [4i + 2: 0..15][4i + 3: 0..15][4i: 16..31] ... [4i + 3: 16..31], the order in which one
// 64-byte load of four groups' q4 codes unpacks; the groups after the last four pair
// up as above. The other builds pair all groups.
inline int64_t group_low(int g, int G) {
    if (ANVE_AVX512 && (g | 3) < G) return (int64_t)(g & ~3) * GROUP + (g & 3) * 16;
    return pair_low(g, G);
}
inline int64_t group_high(int g, int G) {
    if (ANVE_AVX512 && (g | 3) < G) return group_low(g, G) + 2 * GROUP;
    return pair_high(g, G);
}

void quantize_rows(const float *x, int M, int K, QuantRows q) {
    const int G = K / GROUP;
#pragma omp parallel for schedule(static) if (M * G >= 256)  // a few rows: not worth threads
    for (int mg = 0; mg < M * G; ++mg) {
        const float *src = x + (int64_t)mg * GROUP;
        const float d = block_scale(src, GROUP);
        int8_t codes[GROUP];
        const int total = round_group(src, d, codes);
        int8_t *row = q.codes + (int64_t)(mg / G) * K;
        memcpy(row + group_low(mg % G, G), codes, 16);
        memcpy(row + group_high(mg % G, G), codes + 16, 16);
        q.scale[mg] = d;
        q.sum[mg] = d * (float)total;
    }
#if ANVE_AVX512
    for (int64_t i = 0; i < (int64_t)M * K; i += GROUP)
        _mm256_storeu_si256((__m256i *)(q.flipped + i), _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(q.codes + i)), _mm256_set1_epi8((char)0x80)));
#endif
}

inline float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float hsum(__m256 v) {
    return hsum4(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

// e^x for 8 floats (x clamped to +-88): 2^n * p(r), n = round(x / ln 2), |r| <= ln 2 / 2,
// p the degree-6 Taylor polynomial; about 2 ulp.
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

inline __m256 dot_group(__m256i w_u8, const int8_t *xq) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    const __m256i p16 = _mm256_maddubs_epi16(w_u8, x);                    // [16] int16
    const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));     // [8] int32
    return _mm256_cvtepi32_ps(p32);
}

inline __m256i unpack_q4(const uint8_t *codes) {
    const __m128i v = _mm_loadu_si128((const __m128i *)codes);
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(v, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

inline float offset_term(const uint16_t *offset, const float *xsum, int G) {
    __m256 acc = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= G; g += 8) {
        const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(offset + g)));
        acc = _mm256_fmadd_ps(o, _mm256_loadu_ps(xsum + g), acc);
    }
    float total = hsum(acc);
    for (; g < G; ++g) total = fmaf(_cvtsh_ss(offset[g]), xsum[g], total);
    return total;
}

// With a few rows a kernel is neither purely compute- nor memory-bound; asking for its
// weights some blocks ahead (each kernel's *_AHEAD, as measured best) lets the two
// overlap. Prefetches `bytes` from `p` on, a cache line at a time (never faults, even
// past an array's end).
inline void prefetch(const char *p, int bytes) {
    for (int line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

constexpr int Q4_AHEAD = 8 * 8 * GROUP / 2;  // bytes of codes: 8 blocks of 256 inputs

// Two groups' q4 codes (32 bytes) against one row's paired activations (see pair_low):
// [8] int32, the first group's dot product in lanes 0..3, the second's in 4..7.
inline __m256i dot_pair(__m256i low, __m256i high, const int8_t *x) {
#if ANVE_VNNI
    const __m256i a = dpbusd(_mm256_setzero_si256(), low, _mm256_loadu_si256((const __m256i *)x));
    return dpbusd(a, high, _mm256_loadu_si256((const __m256i *)(x + GROUP)));
#else
    const __m256i a = _mm256_maddubs_epi16(low, _mm256_loadu_si256((const __m256i *)x));
    const __m256i b = _mm256_maddubs_epi16(high, _mm256_loadu_si256((const __m256i *)(x + GROUP)));
    return _mm256_madd_epi16(_mm256_add_epi16(a, b), _mm256_set1_epi16(1));  // |a + b| <= 4 * 15 * 127
#endif
}

// 32 bytes of 4-bit codes as two vectors, the first in the low nibbles, the second in the
// high ones (q4: two groups' codes; q4k: two kernel-order vectors); one load and three
// instructions unpack both.
inline void unpack_q4_pair(const uint8_t *codes, __m256i &first, __m256i &second) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)codes);
    const __m256i mask = _mm256_set1_epi8(0x0F);
    first = _mm256_and_si256(v, mask);
    second = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
}

#if ANVE_AVX512
// The sum of a vector's 16 float lanes in a fixed tree (what the amx loops repeat over
// vectors): (l + l8) for l < 8, then (t + t4), (u0 + u2) + (u1 + u3).
inline float sum_lanes(__m512 a) {
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(a),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));  // u0 + u2, u1 + u3
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

// [16] int32: lane 4l + q holds the sum of the four int32 lanes of 128-bit lane l of a[q].
inline __m512i sum_fours(const __m512i a[4]) {
    const __m512i u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
    const __m512i u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
}

// q4 on 512-bit vectors, 16 groups at a time: one 64-byte load of four groups' codes
// unpacks into their first and second 16 codes (against activations stored so, see
// group_low), two vpdpbusd per four groups and row give four int32 lanes per group, and
// sum_fours gathers the 16 groups' sums into one vector (lane 4l + q: group 4q + l),
// whose scales and dx are permuted alike. Groups left over go four, two and one at a
// time. Sums in a fixed order per row: row-independent like the others.
template <int M>
void q4_rows_512(const QuantRows xq, int K, const uint8_t *codes, const uint16_t *scale,
                 const uint16_t *offset, const float *bias, float *y, int N, int n0, int n1) {
    const int G = K / GROUP;
    const __m512i mask = _mm512_set1_epi8(0x0F);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int n = n0; n < n1; ++n) {
        __m512 acc[M];
        __m256 rest[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps(), rest[m] = _mm256_setzero_ps();
        const uint8_t *wrow = codes + (int64_t)n * G * (GROUP / 2);
        const uint16_t *srow = scale + (int64_t)n * G, *orow = offset + (int64_t)n * G;
        int g = 0;
        for (; g + 16 <= G; g += 16) {
            prefetch((const char *)(wrow + g * (GROUP / 2)) + Q4_AHEAD, 16 * GROUP / 2);
            prefetch((const char *)(srow + g) + Q4_AHEAD / 8, 2);
            prefetch((const char *)(orow + g) + Q4_AHEAD / 8, 2);
            __m512i lo[4], hi[4];
            for (int q = 0; q < 4; ++q) {
                const __m512i v = _mm512_loadu_si512((const void *)(wrow + (g + 4 * q) * (GROUP / 2)));
                lo[q] = _mm512_and_si512(v, mask);
                hi[q] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            }
            const __m512 s16 = _mm512_permutexvar_ps(
                order, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(srow + g))));
            for (int m = 0; m < M; ++m) {
                const int8_t *x = xq.codes + ((int64_t)m * G + g) * GROUP;
                __m512i a[4];
                for (int q = 0; q < 4; ++q)
                    a[q] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[q],
                        _mm512_loadu_si512((const void *)(x + 4 * q * GROUP))), hi[q],
                        _mm512_loadu_si512((const void *)(x + 4 * q * GROUP + 2 * GROUP)));
                const __m512 dx = _mm512_permutexvar_ps(order, _mm512_loadu_ps(xq.scale + (int64_t)m * G + g));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_fours(a)), _mm512_mul_ps(s16, dx), acc[m]);
            }
        }
        for (; g + 4 <= G; g += 4) {  // four groups: their sums in lanes 0, 4, 8, 12
            const __m512i v = _mm512_loadu_si512((const void *)(wrow + g * (GROUP / 2)));
            const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            const __m512 s4 = _mm512_maskz_permutexvar_ps(0x1111, order, _mm512_castps128_ps512(
                _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(srow + g)))));
            for (int m = 0; m < M; ++m) {
                const int8_t *x = xq.codes + ((int64_t)m * G + g) * GROUP;
                __m512i a[4] = {_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo,
                                    _mm512_loadu_si512((const void *)x)), hi,
                                    _mm512_loadu_si512((const void *)(x + 2 * GROUP))),
                                _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
                const __m512 dx = _mm512_maskz_permutexvar_ps(0x1111, order, _mm512_castps128_ps512(
                    _mm_loadu_ps(xq.scale + (int64_t)m * G + g)));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_fours(a)), _mm512_mul_ps(s4, dx), acc[m]);
            }
        }
        for (; g + 2 <= G; g += 2) {  // then pairs, as the other builds
            __m256i low, high;
            unpack_q4_pair(wrow + g * (GROUP / 2), low, high);
            const float s0 = _cvtsh_ss(srow[g]), s1 = _cvtsh_ss(srow[g + 1]);
            for (int m = 0; m < M; ++m) {
                const int64_t mg = (int64_t)m * G + g;
                const __m256 both = _mm256_set_m128(_mm_set1_ps(s1 * xq.scale[mg + 1]),
                                                    _mm_set1_ps(s0 * xq.scale[mg]));
                const __m256i d = dot_pair(low, high, xq.codes + mg * GROUP);
                rest[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), both, rest[m]);
            }
        }
        if (g < G) {  // and a last, unpaired group in input order
            const __m256i w = unpack_q4(wrow + g * (GROUP / 2));
            const float s = _cvtsh_ss(srow[g]);
            for (int m = 0; m < M; ++m) {
                const int64_t mg = (int64_t)m * G + g;
                const __m256 d = dot_group(w, xq.codes + mg * GROUP);
                rest[m] = _mm256_fmadd_ps(d, _mm256_set1_ps(s * xq.scale[mg]), rest[m]);
            }
        }
        const float b = bias ? bias[n] : 0.0f;
        for (int m = 0; m < M; ++m) {
            const float corr = offset_term(orow, xq.sum + (int64_t)m * G, G);
            y[(int64_t)m * N + n] = ((_mm512_reduce_add_ps(acc[m]) + hsum(rest[m])) + corr) + b;
        }
    }
}
#endif

// Rows up to which a kernel keeps each row's sums in registers (see q4k_many).
constexpr int FEW = 4;

// M rows' [8] float running sums: in registers up to FEW rows, else in a small array
// (more would not fit the 16 vector registers beside the weights: the compiler spills
// something, and what it picks runs slower). The same values either way.
template <int M, bool InRegisters = (M <= FEW)>
struct Sums {
    __m256 v[M];
    Sums() { for (int m = 0; m < M; ++m) v[m] = _mm256_setzero_ps(); }
    __m256 get(int m) const { return v[m]; }
    void set(int m, __m256 a) { v[m] = a; }
};

template <int M>
struct Sums<M, false> {
    alignas(32) float v[M][8];
    Sums() { for (int m = 0; m < M; ++m) _mm256_store_ps(v[m], _mm256_setzero_ps()); }
    __m256 get(int m) const { return _mm256_load_ps(v[m]); }
    void set(int m, __m256 a) { _mm256_store_ps(v[m], a); }
};

// Output feature n of each of M rows: the sum of its running sums' lanes, plus the bias.
template <int M, bool R>
inline void put_rows(const Sums<M, R> &acc, const float *bias, float *y, int N, int n) {
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) y[(int64_t)m * N + n] = hsum(acc.get(m)) + b;
}

template <int M>
void q4_rows(const QuantRows xq, int K, const uint8_t *codes, const uint16_t *scale,
             const uint16_t *offset, const float *bias, float *y, int N, int n0, int n1) {
#if ANVE_AVX512
    return q4_rows_512<M>(xq, K, codes, scale, offset, bias, y, N, n0, n1);
#endif
    const int G = K / GROUP;
    for (int n = n0; n < n1; ++n) {
        __m256 acc[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
        const uint8_t *wrow = codes + (int64_t)n * G * (GROUP / 2);
        const uint16_t *srow = scale + (int64_t)n * G, *orow = offset + (int64_t)n * G;
        int g = 0;
        for (; g + 8 <= G; g += 8) {  // 8 groups: their sums in one vector, one scale multiply
            prefetch((const char *)(wrow + g * (GROUP / 2)) + Q4_AHEAD, 8 * GROUP / 2);
            prefetch((const char *)(srow + g) + Q4_AHEAD / 8, 1);
            prefetch((const char *)(orow + g) + Q4_AHEAD / 8, 1);
            alignas(32) float both[M][8];  // weight times activation scale, groups 0 2 4 6 1 3 5 7
            const __m256 s8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(srow + g)));
            const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
            for (int m = 0; m < M; ++m)
                _mm256_store_ps(both[m], _mm256_permutevar8x32_ps(
                    _mm256_mul_ps(s8, _mm256_loadu_ps(xq.scale + (int64_t)m * G + g)), order));
            alignas(32) __m256i w[8];
            for (int j = 0; j < 4; ++j) unpack_q4_pair(wrow + (g + 2 * j) * (GROUP / 2), w[2 * j], w[2 * j + 1]);
            for (int m = 0; m < M; ++m) {
                const int8_t *x = xq.codes + ((int64_t)m * G + g) * GROUP;
                const __m256i d01 = _mm256_hadd_epi32(dot_pair(w[0], w[1], x), dot_pair(w[2], w[3], x + 2 * GROUP));
                const __m256i d23 = _mm256_hadd_epi32(dot_pair(w[4], w[5], x + 4 * GROUP),
                                                      dot_pair(w[6], w[7], x + 6 * GROUP));
                const __m256i sums = _mm256_hadd_epi32(d01, d23);  // [8] int32: groups 0 2 4 6 1 3 5 7
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_load_ps(both[m]), acc[m]);
            }
        }
        for (; g + 2 <= G; g += 2) {
            __m256i low, high;
            unpack_q4_pair(wrow + g * (GROUP / 2), low, high);
            const float s0 = _cvtsh_ss(srow[g]), s1 = _cvtsh_ss(srow[g + 1]);
            for (int m = 0; m < M; ++m) {
                const int64_t mg = (int64_t)m * G + g;
                const __m256 both = _mm256_set_m128(_mm_set1_ps(s1 * xq.scale[mg + 1]),
                                                    _mm_set1_ps(s0 * xq.scale[mg]));
                const __m256i d = dot_pair(low, high, xq.codes + mg * GROUP);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), both, acc[m]);
            }
        }
        if (g < G) {  // the last, unpaired group (odd G) is in input order
            const __m256i w = unpack_q4(wrow + g * (GROUP / 2));
            const float s = _cvtsh_ss(srow[g]);
            for (int m = 0; m < M; ++m) {
                const int64_t mg = (int64_t)m * G + g;
                const __m256 d = dot_group(w, xq.codes + mg * GROUP);
                acc[m] = _mm256_fmadd_ps(d, _mm256_set1_ps(s * xq.scale[mg]), acc[m]);
            }
        }
        const float b = bias ? bias[n] : 0.0f;
        for (int m = 0; m < M; ++m) {
            const float corr = offset_term(orow, xq.sum + (int64_t)m * G, G);
            y[(int64_t)m * N + n] = (hsum(acc[m]) + corr) + b;
        }
    }
}

constexpr int SUPER = 256;  // inputs per Q4_K / Q6_K super-block

// The kernel order of a super-block's inputs, for activations and q4k/q6k weights alike:
// 8 vectors of 32 bytes, vector j byte 4g + r holding input 32g + 4j + r (g, j 0..7,
// r 0..3). Then every 16-bit lane of a maddubs product belongs to one 32-group (lanes
// 2g and 2g + 1 to group g), whichever vector it came from, so the products of all 8
// vectors add up in 16 bits (|sum| <= 16 * 15 * 127 for q4k) and one madd per
// super-block applies the 8 groups' scales: 9 multiplies per row instead of 16.
// (The order is its own inverse: a transpose of 8 x 8 blocks of 4 bytes.)
inline int kernel_position(int i) { return (i % GROUP / 4) * GROUP + i / GROUP * 4 + i % 4; }

struct QuantRows256 {
    int8_t *codes;  // [M, K] in kernel order per super-block (slot, or AVX-512: paired_at)
    float *scale;   // [M, K / 256], dx per super-block
    float *bsum;    // [M, K / 32], dx * the sum of each 32-group's codes
    float *gscale;  // [M, K / 32], dx of each 32-group's super-block (AVX-512 only)
    int8_t *flipped;  // [M, K], codes ^ 0x80 (codes + 128 as unsigned; AVX-512 only)
    int8_t *natural;  // the codes in input order, laid out for the tiles (tile_rows; amx only)
    int8_t *slotted;  // [M, K], the codes in slot order (AVX-512, for q6kp calls only)
    int32_t *low32;   // [M, K / 8], -32 * each lane's 8 codes (q6kp_one_512; the same calls)
};

// Where kernel-order vector v (0..7) of a super-block's activations sits. The AVX-512
// loops (q6k, and q4k's unpaired last super-block) read 64 bytes at a time as vectors
// (0, 2), (1, 3), (4, 6), (5, 7): the halves that one 64-byte load of q4k codes unpacks
// into (chunk c's low nibbles are vector 2c).
constexpr int slot(int v) { return ANVE_AVX512 ? (v & 4) | (v & 1) << 1 | (v >> 1 & 1) : v; }

#if ANVE_AVX512
// Where q4k_one_512 finds vector v (32 bytes) of super-block s of a row (offset from the
// row's start): the super-blocks of a pair (2P, 2P + 1) side by side, vector v of both in
// one 64-byte unit (P * 512 + 64 v, the odd one's half second), so that one vpdpbusd per
// vector and row sums both super-blocks' groups in the lanes q4k_one_512 wants them in;
// a last, unpaired super-block in slot order. (The q6k loops read the flipped codes,
// which stay in slot order.)
inline int64_t paired_at(int s, int v, int S) {
    if ((s | 1) < S) return (int64_t)(s / 2) * 2 * SUPER + v * 64 + (s & 1) * GROUP;
    return (int64_t)s * SUPER + slot(v) * GROUP;
}
#endif

#if ANVE_AMX
// Where row m's codes of group g of super-block sb sit for the tiles: per set of 16
// rows, super-block and group, the 16 rows' 32 codes (input order) one after another.
inline int64_t tile_rows(int m, int sb, int g, int K) {
    return (((int64_t)(m / 16) * (K / SUPER) + sb) * (SUPER / GROUP) + g) * 16 * GROUP + (m % 16) * GROUP;
}
#endif

// Rows up to which q6kp's 512-bit loop takes its unsigned codes against slotted and low32
// (more rows: q6k's arithmetic on the flipped codes, where the extra arrays would crowd
// L1; the ways measured best on Zen 4, docs/kernels.md).
constexpr int Q6P_LOW_ROWS = 4;

// (packed6: fill slotted and low32 too, for the q6kp loop of AVX-512.)
void quantize_rows_256(const float *x, int M, int K, QuantRows256 q, bool packed6) {
    const int S = K / SUPER;
#pragma omp parallel for schedule(static) if (M * S >= 32)
    for (int ms = 0; ms < M * S; ++ms) {
        const float *src = x + (int64_t)ms * SUPER;
        const float d = block_scale(src, SUPER);
        int8_t codes[SUPER];
        for (int j = 0; j < SUPER / GROUP; ++j) {
            const int total = round_group(src + j * GROUP, d, codes + j * GROUP);
            q.bsum[(int64_t)ms * (SUPER / GROUP) + j] = d * (float)total;
        }
#if ANVE_AMX
        if (q.natural)  // what the tiles take (tile_rows)
            for (int g = 0; g < SUPER / GROUP; ++g)
                memcpy(q.natural + tile_rows(ms / (K / SUPER), ms % (K / SUPER), g, K), codes + g * GROUP, GROUP);
#endif
#if ANVE_AVX512
        alignas(64) int8_t dst[SUPER];  // slot order: the flipped codes' (q6k); codes: paired_at
#else
        int8_t *dst = q.codes + (int64_t)ms * SUPER;
#endif
        for (int i = 0; i < SUPER; i += 4) {
            const int at = kernel_position(i);
            memcpy(dst + slot(at / GROUP) * GROUP + at % GROUP, codes + i, 4);
        }
        q.scale[ms] = d;
#if ANVE_AVX512
        int8_t *row = q.codes + (int64_t)(ms / S) * K;
        for (int v = 0; v < SUPER / GROUP; ++v)
            memcpy(row + paired_at(ms % S, v, S), dst + slot(v) * GROUP, GROUP);
        for (int j = 0; j < SUPER / GROUP; ++j) q.gscale[(int64_t)ms * (SUPER / GROUP) + j] = d;
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        for (int i = 0; i < SUPER; i += 64)
            _mm512_storeu_si512((void *)(q.flipped + (int64_t)ms * SUPER + i),
                                _mm512_xor_si512(_mm512_load_si512((const void *)(dst + i)), flip));
        if (packed6) {  // q6kp_one_512's signed codes, and its lanes' -32 * sum x
            memcpy(q.slotted + (int64_t)ms * SUPER, dst, SUPER);
            const __m512i ones = _mm512_set1_epi8(1);
            for (int half = 0; half < 2; ++half) {
                const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), ones, _mm512_load_si512((const void *)(dst + 128 * half))),
                    ones, _mm512_load_si512((const void *)(dst + 128 * half + 64)));
                _mm512_storeu_si512((void *)(q.low32 + ((int64_t)ms * 2 + half) * 16),
                                    _mm512_mullo_epi32(sum, _mm512_set1_epi32(-32)));
            }
        }
#else
        (void)packed6;
#endif
    }
}

struct Q4KWeights {
    const uint8_t *codes;  // [N, K / 2], per super-block 4 x 32 bytes (see unpack_q4_pair)
    const uint8_t *meta;   // [N, ceil(K / 512) * Q4K_META]: the factors (q4k_record)
};

// A feature's factors of super-blocks 2P and 2P + 1 in one record of Q4K_META bytes: the
// 8 sc of both (8 + 8 bytes), the 8 mn of both, d of both and dmin of both as float16 (the
// GGUF's own); a lone last super-block's partner fields zero. One stream beside the codes
// (a stream for each of sc, mn, d and dmin cost the one-row step 5-8 % on Zen 4).
constexpr int Q4K_META = 40;
constexpr int Q4K_MN = 16, Q4K_D = 32, Q4K_DMIN = 36;  // where a record's fields start

inline const uint8_t *q4k_record(const Q4KWeights &w, int64_t n, int S, int sb) {
    return w.meta + (n * ((S + 1) / 2) + sb / 2) * Q4K_META;
}
inline const uint8_t *q4k_sc(const uint8_t *record, int sb) { return record + (sb & 1) * 8; }
inline const uint8_t *q4k_mn(const uint8_t *record, int sb) { return record + Q4K_MN + (sb & 1) * 8; }
inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
inline float q4k_d(const uint8_t *record, int sb) { return half_at(record + Q4K_D + (sb & 1) * 2); }
inline float q4k_dmin(const uint8_t *record, int sb) {
    return half_at(record + Q4K_DMIN + (sb & 1) * 2);
}
// How far ahead the loops ask for the records: as many super-blocks as their codes' distance.
constexpr int q4k_meta_ahead(int code_bytes) { return code_bytes / (SUPER / 2) * (Q4K_META / 2); }

// Bytes of codes the Q4_K loops prefetch ahead. The AVX2 loops: 16 super-blocks (2 KiB,
// as far as the q4 and Q6_K loops look; a longer distance slowed the one-row step on the
// AVX2-only EPYC, see docs/measurements.md). The VNNI and 512-bit loops keep the 32 they
// were timed with.
constexpr int Q4K_AHEAD = 16 * SUPER / 2;
constexpr int Q4K_AHEAD_WIDE = 32 * SUPER / 2;

// The 8 groups' scales of a super-block, each in the two 16-bit lanes of its group.
inline __m256i group_scales(const uint8_t *sc) {
    const __m128i s = _mm_loadl_epi64((const __m128i *)sc);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s));
}

// Output feature n of a few rows (M <= FEW; xq and y start at the first of them). Per
// super-block and row, all in one [8] vector (group g in lane g): d * (dx * sc_g * dot_g)
// - (dmin * mn_g) * (dx * bsum_g), the mins' factor shared by the rows.
template <int M>
inline void q4k_few(const QuantRows256 xq, int K, const Q4KWeights w, const float *bias,
                    float *y, int N, int n) {
    const int S = K / SUPER, G = K / GROUP;
    Sums<M> acc;
    for (int sb = 0; sb < S; ++sb) {
        const int64_t g0 = (int64_t)n * G + sb * (SUPER / GROUP);
        const uint8_t *codes = w.codes + g0 * (GROUP / 2);
        prefetch((const char *)codes + Q4K_AHEAD, SUPER / 2);
        const uint8_t *record = q4k_record(w, n, S, sb);
        prefetch((const char *)record + q4k_meta_ahead(Q4K_AHEAD), 1);
        __m256i p16[M];  // [16] int16 per row, lanes 2g and 2g + 1 for group g
        for (int m = 0; m < M; ++m) p16[m] = _mm256_setzero_si256();
        for (int c = 0; c < SUPER / 64; ++c) {
            __m256i wq[2];
            unpack_q4_pair(codes + c * GROUP, wq[0], wq[1]);
            for (int m = 0; m < M; ++m) {
                const int8_t *x = xq.codes + m * (int64_t)K + sb * SUPER + c * 2 * GROUP;
                const __m256i a = _mm256_maddubs_epi16(wq[0], _mm256_loadu_si256((const __m256i *)x));
                const __m256i b = _mm256_maddubs_epi16(wq[1], _mm256_loadu_si256((const __m256i *)(x + GROUP)));
                p16[m] = _mm256_add_epi16(p16[m], _mm256_add_epi16(a, b));
            }
        }
        const __m256i scale = group_scales(q4k_sc(record, sb));
        const __m256 d = _mm256_set1_ps(q4k_d(record, sb));
        const __m256 mins = _mm256_mul_ps(  // [8] dmin * mn_g
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q4k_mn(record, sb)))),
            _mm256_set1_ps(q4k_dmin(record, sb)));
        for (int m = 0; m < M; ++m) {
            const __m256 dots = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p16[m], scale)),
                                              _mm256_broadcast_ss(xq.scale + (int64_t)m * S + sb));
            const __m256 a = _mm256_fmadd_ps(dots, d, acc.get(m));
            acc.set(m, _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xq.bsum + (int64_t)m * G + sb * 8), a));
        }
    }
    put_rows(acc, bias, y, N, n);
}

// The same sums for more rows (M > FEW): per super-block the 8 unpacked weight vectors
// stay in registers and the rows take turns over them, and the rows' running sums live
// in a small array. (With a running sum and a 16-bit sum per row in registers, as
// q4k_few keeps them, the compiler spills the products beyond four rows, and the loop
// runs slower.) Each row's integers are q4k_few's, added in another order (exact in 16
// bits), and its float steps are the same: the same bits.
template <int M>
inline void q4k_many(const QuantRows256 xq, int K, const Q4KWeights w, const float *bias,
                     float *y, int N, int n) {
    const int S = K / SUPER, G = K / GROUP;
    Sums<M> acc;
    for (int sb = 0; sb < S; ++sb) {
        const int64_t g0 = (int64_t)n * G + sb * (SUPER / GROUP);
        const uint8_t *codes = w.codes + g0 * (GROUP / 2);
        prefetch((const char *)codes + Q4K_AHEAD, SUPER / 2);
        const uint8_t *record = q4k_record(w, n, S, sb);
        prefetch((const char *)record + q4k_meta_ahead(Q4K_AHEAD), 1);
        __m256i wq[8];  // kernel-order vectors 0..7
        for (int c = 0; c < SUPER / 64; ++c) unpack_q4_pair(codes + c * GROUP, wq[2 * c], wq[2 * c + 1]);
        const __m256i scale = group_scales(q4k_sc(record, sb));
        const __m256 d = _mm256_set1_ps(q4k_d(record, sb));
        const __m256 mins = _mm256_mul_ps(  // [8] dmin * mn_g
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q4k_mn(record, sb)))),
            _mm256_set1_ps(q4k_dmin(record, sb)));
        for (int m = 0; m < M; ++m) {
            const int8_t *x = xq.codes + m * (int64_t)K + sb * SUPER;
            __m256i p[8];  // [16] int16 each, lanes 2g and 2g + 1 for group g
            for (int v = 0; v < 8; ++v)
                p[v] = _mm256_maddubs_epi16(wq[v], _mm256_loadu_si256((const __m256i *)(x + v * GROUP)));
            const __m256i p16 = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
            const __m256 dots = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scale)),
                                              _mm256_broadcast_ss(xq.scale + (int64_t)m * S + sb));
            __m256 a = _mm256_fmadd_ps(dots, d, acc.get(m));
            acc.set(m, _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xq.bsum + (int64_t)m * G + sb * 8), a));
        }
    }
    put_rows(acc, bias, y, N, n);
}

#if ANVE_VNNI
// The same sums with vpdpbusd: per super-block the 8 unpacked weight vectors stay in
// registers and each row's 8 group dot products come out in the int32 lanes directly
// (lane g: group g, exact); sc_g * dot_g is exact in float32 (< 2^24), so every row
// gets what the AVX2 loops above (q4k_few, q4k_many) give it, bit for bit.
template <int M>
inline void q4k_one_vnni(const QuantRows256 xq, int K, const Q4KWeights w, const float *bias,
                         float *y, int N, int n) {
    const int S = K / SUPER, G = K / GROUP;
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    for (int sb = 0; sb < S; ++sb) {
        const int64_t g0 = (int64_t)n * G + sb * (SUPER / GROUP);
        const uint8_t *codes = w.codes + g0 * (GROUP / 2);
        prefetch((const char *)codes + Q4K_AHEAD_WIDE, SUPER / 2);
        const uint8_t *record = q4k_record(w, n, S, sb);
        prefetch((const char *)record + q4k_meta_ahead(Q4K_AHEAD_WIDE), 1);
        __m256i wq[8];
        for (int c = 0; c < SUPER / 64; ++c) unpack_q4_pair(codes + c * GROUP, wq[2 * c], wq[2 * c + 1]);
        const __m256 scale = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q4k_sc(record, sb))));
        const __m256 d = _mm256_set1_ps(q4k_d(record, sb));
        const __m256 mins = _mm256_mul_ps(  // [8] dmin * mn_g
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q4k_mn(record, sb)))),
            _mm256_set1_ps(q4k_dmin(record, sb)));
        for (int m = 0; m < M; ++m) {
            const int8_t *x = xq.codes + m * (int64_t)K + sb * SUPER;
            __m256i i32 = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j)
                i32 = dpbusd(i32, wq[j], _mm256_loadu_si256((const __m256i *)(x + slot(j) * GROUP)));
            const __m256 dots = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(i32), scale),
                                              _mm256_broadcast_ss(xq.scale + (int64_t)m * S + sb));
            acc[m] = _mm256_fmadd_ps(dots, d, acc[m]);
            acc[m] = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xq.bsum + (int64_t)m * G + sb * 8), acc[m]);
        }
    }
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) y[(int64_t)m * N + n] = hsum(acc[m]) + b;
}
#endif

#if ANVE_AVX512
// 16 bytes as [16] float.
inline __m512 bytes16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

// The [16] int32 group sums of two super-blocks (lanes 0..7: a's groups, 8..15: b's) from
// their 512-bit dot products, each holding a group's sum split over its two halves.
inline __m512i join_halves(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xEE));
}

// q4k's factors of super-blocks sb and sb + 1 (sb even; lanes 8..15 zero without a
// second: its record's fields are) from their record: scd = float(sc_g) * d and
// mins = float(mn_g) * dmin.
inline void q4k_factors(const uint8_t *record, __m512 &scd, __m512 &mins) {
    // [d of sb, d of sb + 1, dmin of sb, dmin of sb + 1]
    const __m512 dd = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(record + Q4K_D))));
    const __m512i first = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    scd = _mm512_mul_ps(bytes16(record), _mm512_permutexvar_ps(first, dd));
    mins = _mm512_mul_ps(bytes16(record + Q4K_MN),
                         _mm512_permutexvar_ps(_mm512_add_epi32(first, _mm512_set1_epi32(2)), dd));
}

// Every row's running sums after super-blocks sb (and sb + 1 when Two) of F output
// features at once, against unpacked codes wq[f] (see q4k_one_512): each activation
// vector is loaded once for the F features. Per row and feature: the 16 group sums
// (lane l: group l % 8 of super-block sb + l / 8; a lone super-block's halves joined, its
// partner's lanes zero), then (dot_g * sc_g * d) * dx - (dmin * mn_g) * (dx * bsum_g).
template <int M, int F, bool Two>
__attribute__((always_inline)) inline void q4k_fold_rows(const QuantRows256 &xq, int K, int G,
                                                         int sb, const __m512i (*wq)[8],
                                                         const __m512 *scd, const __m512 *mins,
                                                         __m512 (&acc)[F][M]) {
    constexpr bool chains = M * F < 4;  // two sums per row and feature, for latency
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
        const int8_t *x = xq.codes + m * (int64_t)K + sb * SUPER;
        __m512i a[F], b[F];
#pragma GCC unroll 2
        for (int f = 0; f < F; ++f) a[f] = b[f] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __m512i lo = _mm512_loadu_si512((const void *)(x + 64 * j));
#pragma GCC unroll 2
            for (int f = 0; f < F; ++f) a[f] = _mm512_dpbusd_epi32(a[f], wq[f][j], lo);
            if constexpr (Two) {
                const __m512i hi = _mm512_loadu_si512((const void *)(x + 64 * (4 + j)));
#pragma GCC unroll 2
                for (int f = 0; f < F; ++f) {
                    if constexpr (chains) b[f] = _mm512_dpbusd_epi32(b[f], wq[f][4 + j], hi);
                    else a[f] = _mm512_dpbusd_epi32(a[f], wq[f][4 + j], hi);
                }
            }
        }
        const int64_t at = (int64_t)m * G + sb * (SUPER / GROUP);
        const __m512 gs = Two ? _mm512_loadu_ps(xq.gscale + at) : _mm512_maskz_loadu_ps(0x00FF, xq.gscale + at);
        const __m512 bs = Two ? _mm512_loadu_ps(xq.bsum + at) : _mm512_maskz_loadu_ps(0x00FF, xq.bsum + at);
#pragma GCC unroll 2
        for (int f = 0; f < F; ++f) {
            const __m512i sums = !Two ? join_halves(a[f], b[f]) : chains ? _mm512_add_epi32(a[f], b[f]) : a[f];
            const __m512 dots = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scd[f]);
            acc[f][m] = _mm512_fmadd_ps(dots, gs, acc[f][m]);
            acc[f][m] = _mm512_fnmadd_ps(mins[f], bs, acc[f][m]);
        }
    }
}

// q4k on 512-bit vectors, two super-blocks at a time, for output features n .. n + F - 1
// (F = 2 shares each activation load between two features; the same bits as F = 1). Per
// pair the codes' 64-byte loads are regrouped once (for all rows) so that each vector
// holds vector v of both super-blocks (sb's in the low 256 bits), against activations
// stored alike (paired_at): eight vpdpbusd per row leave group g of sb in lane g and of
// sb + 1 in lane 8 + g. Per row and pair the 16 group sums take their factors in one
// [16] vector: (dot_g * sc_g * d) * dx - (dmin * mn_g) * (dx * bsum_g). A last, unpaired
// super-block unpacks into vectors (0, 2), (1, 3), (4, 6), (5, 7) against activations in
// slot order, its two halves joined, and its partner's lanes zero. Every group sum is
// exact, so the pairing changes no bit of any output.
template <int M, int F>
inline void q4k_one_512(const QuantRows256 xq, int K, const Q4KWeights w, const float *bias,
                        float *y, int N, int n) {
    const int S = K / SUPER, G = K / GROUP;
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[F][M];
#pragma GCC unroll 2
    for (int f = 0; f < F; ++f)
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) acc[f][m] = _mm512_setzero_ps();
    int sb = 0;
    for (; sb + 1 < S; sb += 2) {  // whole pairs
        __m512i wq[F][8];  // vector v of sb (low 256 bits) and of sb + 1
        __m512 scd[F], mins[F];
#pragma GCC unroll 2
        for (int f = 0; f < F; ++f) {
            const int64_t g0 = (int64_t)(n + f) * G + sb * (SUPER / GROUP);
            const uint8_t *codes = w.codes + g0 * (GROUP / 2);
            const uint8_t *record = q4k_record(w, n + f, S, sb);
            prefetch((const char *)codes + Q4K_AHEAD_WIDE, SUPER);
            prefetch((const char *)record + q4k_meta_ahead(Q4K_AHEAD_WIDE), 1);
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {  // chunks 2h, 2h + 1: vectors 4h .. 4h + 3
                const __m512i c = _mm512_loadu_si512((const void *)(codes + 64 * h));
                const __m512i d = _mm512_loadu_si512((const void *)(codes + SUPER / 2 + 64 * h));
                const __m512i first = _mm512_shuffle_i64x2(c, d, 0x44);  // chunk 2h of both
                const __m512i second = _mm512_shuffle_i64x2(c, d, 0xEE);  // chunk 2h + 1
                wq[f][4 * h] = _mm512_and_si512(first, mask);
                wq[f][4 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(first, 4), mask);
                wq[f][4 * h + 2] = _mm512_and_si512(second, mask);
                wq[f][4 * h + 3] = _mm512_and_si512(_mm512_srli_epi16(second, 4), mask);
            }
            q4k_factors(record, scd[f], mins[f]);
        }
        q4k_fold_rows<M, F, true>(xq, K, G, sb, wq, scd, mins, acc);
    }
    if (sb < S) {  // a last, unpaired super-block: its partner's lanes zero
        __m512i wq[F][8];  // vectors (0, 2), (1, 3), (4, 6), (5, 7)
        __m512 scd[F], mins[F];
#pragma GCC unroll 2
        for (int f = 0; f < F; ++f) {
            const int64_t g0 = (int64_t)(n + f) * G + sb * (SUPER / GROUP);
            const uint8_t *codes = w.codes + g0 * (GROUP / 2);
            for (int c = 0; c < 2; ++c) {
                const __m512i v = _mm512_loadu_si512((const void *)(codes + c * 64));
                wq[f][2 * c] = _mm512_and_si512(v, mask);
                wq[f][2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            }
            q4k_factors(q4k_record(w, n + f, S, sb), scd[f], mins[f]);
        }
        q4k_fold_rows<M, F, false>(xq, K, G, sb, wq, scd, mins, acc);
    }
#pragma GCC unroll 2
    for (int f = 0; f < F; ++f) {
        const float b = bias ? bias[n + f] : 0.0f;
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) y[(int64_t)m * N + n + f] = sum_lanes(acc[f][m]) + b;
    }
}
#endif

// Bytes of activations (rows times inputs) above which q4k's AVX-512 loop takes two
// output features at once: the rows no longer fit a core's L1 data cache (32 KiB on Zen
// 4, 48 on Intel's recent cores), and loading each activation vector once for two
// features halves what streams in from L2. Below it the second feature's registers cost
// more than they save.
constexpr int64_t TWO_FEATURES_FROM = 32 * 1024;

template <int M>
void q4k_rows(const QuantRows256 xq, int K, const Q4KWeights w, const float *bias, float *y,
              int N, int n0, int n1) {
#if ANVE_AVX512
    int n = n0;
    if constexpr (M >= 2)
        if ((int64_t)M * K > TWO_FEATURES_FROM)
            for (; n + 1 < n1; n += 2) q4k_one_512<M, 2>(xq, K, w, bias, y, N, n);
    for (; n < n1; ++n) q4k_one_512<M, 1>(xq, K, w, bias, y, N, n);
#elif ANVE_VNNI
    for (int n = n0; n < n1; ++n) q4k_one_vnni<M>(xq, K, w, bias, y, N, n);
#else
    for (int n = n0; n < n1; ++n) {
        if constexpr (M <= FEW) q4k_few<M>(xq, K, w, bias, y, N, n);
        else q4k_many<M>(xq, K, w, bias, y, N, n);
    }
#endif
}

struct Q6KWeights {
    const int8_t *q;   // [N, K] in kernel order per super-block
    const int8_t *sc;  // [N, K / 16]
    const float *d;    // [N, K / 256]
};

// One output feature's Q6_K arrays (the 256-bit loops take a feature at a time).
struct Q6KRow {
    const int8_t *q;   // [K] in kernel order per super-block
    const int8_t *sc;  // [K / 16]
    const float *d;    // [K / 256]
};

constexpr int Q6_AHEAD = 8 * SUPER;  // bytes of codes: 8 super-blocks

// Q6_K's 16 scales of a super-block (one per 16 inputs), as the lanes of kernel-order
// vectors 0..3 (half 0: first 16 inputs of each group) or 4..7 (half 1) need them.
inline __m256i half_scales(__m128i sc16, int half) {
    const __m128i pick = half ? _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15)
                              : _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc16, pick));
}

// Output feature n of a few rows (M <= FEW).
template <int M>
inline void q6k_few(const QuantRows256 xq, int K, const Q6KRow w, const float *bias, float *y,
                    int N, int n) {
    const int S = K / SUPER;
    Sums<M> acc;
    for (int sb = 0; sb < S; ++sb) {
        const int8_t *codes = w.q + sb * SUPER;
        prefetch((const char *)codes + Q6_AHEAD, SUPER);
        prefetch((const char *)(w.sc + 16 * sb) + Q6_AHEAD / 16, 1);
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(w.sc + 16 * sb));
        __m256i i32[M];  // [8] int32 per row, group g in lane g
        for (int m = 0; m < M; ++m) i32[m] = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {  // 4 vectors add up in 16 bits (<= 16 * 32 * 127)
            __m256i p16[M];
            for (int m = 0; m < M; ++m) p16[m] = _mm256_setzero_si256();
            for (int j = 4 * half; j < 4 * half + 4; ++j) {
                const __m256i wq = _mm256_loadu_si256((const __m256i *)(codes + j * GROUP));
                const __m256i w_abs = _mm256_sign_epi8(wq, wq);
                for (int m = 0; m < M; ++m) {
                    const __m256i x = _mm256_loadu_si256(
                        (const __m256i *)(xq.codes + m * (int64_t)K + sb * SUPER + j * GROUP));
                    p16[m] = _mm256_add_epi16(p16[m], _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, wq)));
                }
            }
            const __m256i scale = half_scales(sc16, half);
            for (int m = 0; m < M; ++m) i32[m] = _mm256_add_epi32(i32[m], _mm256_madd_epi16(p16[m], scale));
        }
        const float d = w.d[sb];
        for (int m = 0; m < M; ++m) {
            const float dx = xq.scale[(int64_t)m * S + sb];
            acc.set(m, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32[m]), _mm256_set1_ps(d * dx), acc.get(m)));
        }
    }
    put_rows(acc, bias, y, N, n);
}

// The same sums for more rows (M > FEW; see q4k_many): per super-block the weights'
// magnitudes (and their signs, which go onto the activations) are read once and the rows
// take turns over them, each row's two halves summed in 16 bits and scaled into [8]
// int32 (group g in lane g); the running sums live in a small array. The same integers
// and float steps as q6k_few: the same bits.
template <int M>
inline void q6k_many(const QuantRows256 xq, int K, const Q6KRow w, const float *bias, float *y,
                     int N, int n) {
    const int S = K / SUPER;
    Sums<M> acc;
    for (int sb = 0; sb < S; ++sb) {
        const int8_t *codes = w.q + sb * SUPER;
        prefetch((const char *)codes + Q6_AHEAD, SUPER);
        prefetch((const char *)(w.sc + 16 * sb) + Q6_AHEAD / 16, 1);
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(w.sc + 16 * sb));
        __m256i wq[8], w_abs[8];
        for (int j = 0; j < 8; ++j) {
            wq[j] = _mm256_loadu_si256((const __m256i *)(codes + j * GROUP));
            w_abs[j] = _mm256_sign_epi8(wq[j], wq[j]);
        }
        const __m256i scale[2] = {half_scales(sc16, 0), half_scales(sc16, 1)};
        const float d = w.d[sb];
        for (int m = 0; m < M; ++m) {
            const int8_t *x = xq.codes + m * (int64_t)K + sb * SUPER;
            __m256i p[8];
            for (int j = 0; j < 8; ++j)
                p[j] = _mm256_maddubs_epi16(w_abs[j], _mm256_sign_epi8(
                    _mm256_loadu_si256((const __m256i *)(x + j * GROUP)), wq[j]));
            // each half's 4 vectors add up in 16 bits (<= 16 * 32 * 127), exact in any order
            const __m256i low = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
            const __m256i high = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
            const __m256i i32 = _mm256_add_epi32(_mm256_madd_epi16(low, scale[0]),
                                                 _mm256_madd_epi16(high, scale[1]));
            const float dx = xq.scale[(int64_t)m * S + sb];
            acc.set(m, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_set1_ps(d * dx), acc.get(m)));
        }
    }
    put_rows(acc, bias, y, N, n);
}

#if ANVE_VNNI
// Q6_K's scales of one half (see half_scales) as [8] int32, group g in lane g.
inline __m256i half_scales32(__m128i sc16, int half) {
    const __m128i pick = half ? _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15)
                              : _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc16, pick));
}

// The same sums with vpdpbusd on signed codes: the activations flipped to unsigned
// (x ^ 0x80 = x + 128) against the signed weights give sum x * w + 128 * sum w, and the
// second term, the weights' alone, is taken off once for all rows. Each half's group
// sums land in the int32 lanes (lane g: group g) and take their scales as int32: the
// same exact integers as the AVX2 loop, so the same bits.
template <int M>
inline void q6k_one_vnni(const QuantRows256 xq, int K, const Q6KRow w, const float *bias, float *y,
                         int N, int n) {
    const int S = K / SUPER;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    for (int sb = 0; sb < S; ++sb) {
        const int8_t *codes = w.q + sb * SUPER;
        prefetch((const char *)codes + Q6_AHEAD, SUPER);
        prefetch((const char *)(w.sc + 16 * sb) + Q6_AHEAD / 16, 1);
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(w.sc + 16 * sb));
        __m256i wq[8], minus[2], scale[2];
        for (int half = 0; half < 2; ++half) {
            minus[half] = _mm256_setzero_si256();
            for (int j = 4 * half; j < 4 * half + 4; ++j) {
                wq[j] = _mm256_loadu_si256((const __m256i *)(codes + j * GROUP));
                minus[half] = dpbusd(minus[half], flip, wq[j]);
            }
            scale[half] = half_scales32(sc16, half);
        }
        const float d = w.d[sb];
        for (int m = 0; m < M; ++m) {
            const int8_t *x = xq.codes + m * (int64_t)K + sb * SUPER;
            __m256i i32 = _mm256_setzero_si256();
            for (int half = 0; half < 2; ++half) {
                __m256i dots = _mm256_setzero_si256();
                for (int j = 4 * half; j < 4 * half + 4; ++j)
                    dots = dpbusd(dots, _mm256_xor_si256(
                        _mm256_loadu_si256((const __m256i *)(x + slot(j) * GROUP)), flip), wq[j]);
                i32 = _mm256_add_epi32(i32, _mm256_mullo_epi32(_mm256_sub_epi32(dots, minus[half]),
                                                               scale[half]));
            }
            const float dx = xq.scale[(int64_t)m * S + sb];
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_set1_ps(d * dx), acc[m]);
        }
    }
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) y[(int64_t)m * N + n] = hsum(acc[m]) + b;
}
#endif

#if ANVE_AVX512
// A row's running sum after one Q6_K super-block, from its two halves' [16] int32 sums
// (exact in float32: |sum * sc| < 2^23, and the halves join exactly) and d * dx. The
// q6k and q6kp loops share it: the same float steps, the same bits.
inline __m512 q6k_fold_512(const __m512i (&dots)[2], const __m512 (&scale)[2], float d_dx,
                           __m512 acc) {
    const __m512 both = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[1]), scale[1],
                                        _mm512_mul_ps(_mm512_cvtepi32_ps(dots[0]), scale[0]));
    return _mm512_fmadd_ps(both, _mm512_set1_ps(d_dx), acc);
}

// y[m, n] = the sum of row m's lanes + bias[n].
template <int M>
inline void put_rows_512(const __m512 (&acc)[M], const float *bias, float *y, int N, int n) {
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < M; ++m) y[(int64_t)m * N + n] = _mm512_reduce_add_ps(acc[m]) + b;
}

// q6k on 512-bit vectors: the weight vectors paired as the activations are stored,
// (0, 2), (1, 3), (4, 6), (5, 7) (slot), against the flipped activations (x + 128,
// unsigned) stored once per call, so each half's sums cost two vpdpbusd per row; each
// half-sum is exact in float32 (|sum * sc| < 2^23) and both halves join exactly, and
// the [16] lanes (a group's two 256-bit halves apart) take d * dx in one multiply-add.
template <int M>
inline void q6k_one_512(const QuantRows256 xq, int K, const Q6KWeights w, const float *bias,
                        float *y, int N, int n) {
    const int S = K / SUPER, G = K / GROUP;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int sb = 0; sb < S; ++sb) {
        const int64_t g0 = (int64_t)n * G + sb * (SUPER / GROUP);
        const int8_t *codes = w.q + g0 * GROUP;
        prefetch((const char *)codes + Q6_AHEAD, SUPER);
        prefetch((const char *)(w.sc + 2 * g0) + Q6_AHEAD / 16, 1);
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(w.sc + 2 * g0));
        __m512i wq[4], minus[2];  // wq[i]: the vectors at slots 2i, 2i + 1
        __m512 scale[2];
        for (int i = 0; i < 4; ++i) {
            const int v = (i & 2) * 2 + (i & 1);  // 0, 1, 4, 5 and their partners + 2
            wq[i] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(codes + v * GROUP))),
                _mm256_loadu_si256((const __m256i *)(codes + (v + 2) * GROUP)), 1);
        }
        for (int half = 0; half < 2; ++half) {
            const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                _mm512_setzero_si512(), flip, wq[2 * half]), flip, wq[2 * half + 1]);
            minus[half] = _mm512_sub_epi32(_mm512_setzero_si512(), sum);  // -128 * sum w
            scale[half] = _mm512_cvtepi32_ps(_mm512_broadcast_i64x4(half_scales32(sc16, half)));
        }
        const float d = w.d[(int64_t)n * S + sb];
        for (int m = 0; m < M; ++m) {
            const int8_t *x = xq.flipped + m * (int64_t)K + sb * SUPER;
            __m512i dots[2];
            for (int half = 0; half < 2; ++half) {
                dots[half] = _mm512_dpbusd_epi32(minus[half],
                    _mm512_loadu_si512((const void *)(x + 128 * half)), wq[2 * half]);
                dots[half] = _mm512_dpbusd_epi32(dots[half],
                    _mm512_loadu_si512((const void *)(x + 128 * half + 64)), wq[2 * half + 1]);
            }
            acc[m] = q6k_fold_512(dots, scale, d * xq.scale[(int64_t)m * S + sb], acc[m]);
        }
    }
    put_rows_512(acc, bias, y, N, n);
}
#endif

#if ANVE_AMX
// --- AMX-INT8 (the amx build): q4k calls of AMX_FROM rows or more on tiles -----------
//
// The tiles compute C[m][n] = sum_k A[m][k] * B[k][n] exactly in int32 for up to 16 rows
// m of activations (A: int8 in input order, one tile per 32-group, laid out by
// tile_rows) and 16 output features n (B: the weights' 4-bit codes as bytes, 4
// consecutive inputs of one feature per dword, built per call by a 16 x 16 dword
// transpose of 16 features' packed codes). Every group's dot product comes out exact:
// the very integers q4k_one_512 gets from vpdpbusd. The float steps that follow are
// q4k_one_512's, lane by lane (lane l: group l % 8 of super-block 2 pair + l / 8) and in
// the same order, only vectorised over the 16 features instead of the 16 lanes, and the
// lanes are added in sum_lanes' tree: each output is q4k_one_512's, bit for bit, so the
// variant keeps the row promise with tiles for many rows and vpdpbusd for few.

bool amx_ready = false;  // the OS lets this process use tile data (asked once at load)

__attribute__((constructor)) void request_amx() {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    amx_ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

struct alignas(64) TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Tiles 0..3 hold results (rows x 16 int32), 4..5 activations (rows x 32 bytes), 6..7
// weights (8 x 64 bytes). Loaded by each thread at the start of every call that uses
// tiles (another library in the process may have loaded a shape of its own), released
// at its end.
inline void configure_tiles(int rows) {
    TileConfig c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int t = 0; t < 4; ++t) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    for (int t = 4; t < 6; ++t) c.rows[t] = (uint8_t)rows, c.colsb[t] = GROUP;
    for (int t = 6; t < 8; ++t) c.rows[t] = 8, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

// r[i] (16 rows of 16 dwords) transposed in place: r[i] lane j = old r[j] lane i.
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    __m512i u[4][4];  // u[R][q], 128-bit lane L: column 4L + q of rows 4R .. 4R + 3
    for (int R = 0; R < 4; ++R) {
        u[R][0] = _mm512_unpacklo_epi64(t[4 * R], t[4 * R + 2]);
        u[R][1] = _mm512_unpackhi_epi64(t[4 * R], t[4 * R + 2]);
        u[R][2] = _mm512_unpacklo_epi64(t[4 * R + 1], t[4 * R + 3]);
        u[R][3] = _mm512_unpackhi_epi64(t[4 * R + 1], t[4 * R + 3]);
    }
    for (int q = 0; q < 4; ++q) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[0][q], u[1][q], 0x44);
        const __m512i x1 = _mm512_shuffle_i32x4(u[0][q], u[1][q], 0xEE);
        const __m512i x2 = _mm512_shuffle_i32x4(u[2][q], u[3][q], 0x44);
        const __m512i x3 = _mm512_shuffle_i32x4(u[2][q], u[3][q], 0xEE);
        r[q] = _mm512_shuffle_i32x4(x0, x2, 0x88);
        r[4 + q] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
        r[8 + q] = _mm512_shuffle_i32x4(x1, x3, 0x88);
        r[12 + q] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
    }
}

// 64 bytes from row n of a [rows, stride] byte array, zeros for a row past the tile.
inline __m512i row64(const uint8_t *base, int64_t stride, int n, int valid) {
    return n < valid ? _mm512_loadu_si512((const void *)(base + (int64_t)n * stride))
                     : _mm512_setzero_si512();
}

// Four tile products of group/block t0 .. t0 + 3: C tile (t & 3) = A(t) . B(t), stored
// at c + 256 t (int32); A(t) at a_at(t) (a_stride bytes a row), B(t) at b_at(t) (64).
#define ANVE_AMX_FOUR(DP, t0, a_at, a_stride, b_at, c)                                    \
    do {                                                                                  \
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);                       \
        _tile_loadd(4, a_at((t0) + 0), a_stride);                                         \
        _tile_loadd(6, b_at((t0) + 0), 64);                                               \
        _tile_loadd(5, a_at((t0) + 1), a_stride);                                         \
        _tile_loadd(7, b_at((t0) + 1), 64);                                               \
        DP(0, 4, 6);                                                                      \
        DP(1, 5, 7);                                                                      \
        _tile_loadd(4, a_at((t0) + 2), a_stride);                                         \
        _tile_loadd(6, b_at((t0) + 2), 64);                                               \
        _tile_loadd(5, a_at((t0) + 3), a_stride);                                         \
        _tile_loadd(7, b_at((t0) + 3), 64);                                               \
        DP(2, 4, 6);                                                                      \
        DP(3, 5, 7);                                                                      \
        _tile_stored(0, (c) + ((t0) + 0) * 256, 64);                                      \
        _tile_stored(1, (c) + ((t0) + 1) * 256, 64);                                      \
        _tile_stored(2, (c) + ((t0) + 2) * 256, 64);                                      \
        _tile_stored(3, (c) + ((t0) + 3) * 256, 64);                                      \
    } while (0)



inline __m512i row_offsets(int stride) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32(stride));
}

// q4k_one_512 for output features n0 .. n1 - 1 (at most 16) of all M rows (the tiles
// configured for amx_rows(M) rows by the caller's thread), its integer
// sums from tiles: per super-block pair, the 16 groups' exact sums (lane l: group l % 8
// of super-block 2 pair + l / 8; an odd last one's partner all zeros, as there), then
// for each lane the same float steps in the same order, vectorised over the features
// instead of the lanes (a row's 16 lane sums stay in registers), the lanes added in
// sum_lanes' tree: the bits of q4k_one_512.
void q4k_amx(const QuantRows256 xq, int M, int K, const Q4KWeights w, const float *bias,
             float *y, int N, int n0, int n1) {
    const int S = K / SUPER, G = K / GROUP, valid = n1 - n0, pairs = (S + 1) / 2;
    const int sets = (M + AMX_ROWS - 1) / AMX_ROWS;
    const __mmask16 live = (__mmask16)((1u << valid) - 1);
    alignas(64) uint8_t bbuf[8 * 8 * 64];  // [group][j][16 features x 4 bytes]
    // [pair][scd, mins][lane][feature]: float(sc) * d and float(mn) * dmin
    float *fac = (float *)aligned_alloc(64, (size_t)pairs * 2 * 256 * sizeof(float));
    // [set][super-block, 2 pairs of them][group][16 rows][feature]: the exact group sums
    int32_t *cb = (int32_t *)aligned_alloc(64, (size_t)sets * 2 * pairs * 8 * 256 * sizeof(int32_t));
    const __m512i nibble = _mm512_set1_epi8(0x0F), byte = _mm512_set1_epi32(0xFF);
    const __m512i by_record = row_offsets(pairs * Q4K_META);  // feature i's records
    const uint8_t *tile = w.codes + (int64_t)n0 * (K / 2);
    for (int sb = 0; sb < S; ++sb) {
        prefetch((const char *)tile + 16 * (int64_t)(K / 2) + sb * 16 * (SUPER / 2), 16 * SUPER / 2);
        float *f = fac + (sb / 2) * 512 + (sb & 1) * 128;  // lanes 8 (sb & 1) ..
        const uint8_t *record = q4k_record(w, n0, S, sb);
        // the float16 d (dmin) of both super-blocks of the pair per feature, this one's taken
        const __m512i dd = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, by_record,
                                                       (const void *)(record + Q4K_D), 1);
        const __m512i mm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, by_record,
                                                       (const void *)(record + Q4K_DMIN), 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16 * (sb & 1))));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(mm, 16 * (sb & 1))));
        for (int h = 0; h < 2; ++h) {
            const __m512i sc4 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, by_record,
                (const void *)(q4k_sc(record, sb) + 4 * h), 1);
            const __m512i mn4 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, by_record,
                (const void *)(q4k_mn(record, sb) + 4 * h), 1);
            for (int b = 0; b < 4; ++b) {
                const int g = 4 * h + b;
                _mm512_store_ps(f + 16 * g, _mm512_mul_ps(_mm512_cvtepi32_ps(
                    _mm512_and_si512(_mm512_srli_epi32(sc4, 8 * b), byte)), d));
                _mm512_store_ps(f + 256 + 16 * g, _mm512_mul_ps(_mm512_cvtepi32_ps(
                    _mm512_and_si512(_mm512_srli_epi32(mn4, 8 * b), byte)), dmin));
            }
        }
        for (int half = 0; half < 2; ++half) {  // bytes 64 * half .. of each feature's 128
            __m512i r[16];
            for (int n = 0; n < 16; ++n) r[n] = row64(tile + sb * (SUPER / 2) + 64 * half, K / 2, n, valid);
            transpose16(r);
            for (int i = 0; i < 16; ++i) {  // packed dword i: chunk 2 half + i / 8, group i % 8
                const int c = 2 * half + i / 8, g = i % 8;
                _mm512_store_si512((void *)(bbuf + (g * 8 + 2 * c) * 64), _mm512_and_si512(r[i], nibble));
                _mm512_store_si512((void *)(bbuf + (g * 8 + 2 * c + 1) * 64),
                                   _mm512_and_si512(_mm512_srli_epi16(r[i], 4), nibble));
            }
        }
        for (int set = 0; set < sets; ++set) {
            const int8_t *a = xq.natural + ((int64_t)set * S + sb) * AMX_ROWS * SUPER;  // see tile_rows
            int32_t *c = cb + ((int64_t)set * 2 * pairs + sb) * 8 * 256;
            const auto a_at = [&](int g) { return a + g * (AMX_ROWS * GROUP); };
            const auto b_at = [&](int g) { return bbuf + g * 512; };
            ANVE_AMX_FOUR(_tile_dpbsud, 0, a_at, GROUP, b_at, c);
            ANVE_AMX_FOUR(_tile_dpbsud, 4, a_at, GROUP, b_at, c);
        }
    }
    if (S & 1) {  // the last pair's second half: zeros
        memset(fac + (pairs - 1) * 512 + 128, 0, 128 * sizeof(float));
        memset(fac + (pairs - 1) * 512 + 384, 0, 128 * sizeof(float));
        for (int set = 0; set < sets; ++set)
            memset(cb + ((int64_t)set * 2 * pairs + S) * 8 * 256, 0, 8 * 256 * sizeof(int32_t));
    }
    const __m512 b = bias ? _mm512_maskz_loadu_ps(live, bias + n0) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) {
        const int32_t *c = cb + (int64_t)(m / AMX_ROWS) * 2 * pairs * 8 * 256 + (m % AMX_ROWS) * 16;
        __m512 acc[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
        for (int pair = 0; pair < pairs; ++pair) {
            const float *f = fac + pair * 512;
            const int64_t at = (int64_t)m * G + pair * 16;
            const bool two = 2 * pair + 1 < S;
            const __m512 dx0 = _mm512_set1_ps(xq.scale[(int64_t)m * S + 2 * pair]);  // = gscale's
            const __m512 dx1 = two ? _mm512_set1_ps(xq.scale[(int64_t)m * S + 2 * pair + 1])
                                   : _mm512_setzero_ps();
#pragma GCC unroll 16
            for (int l = 0; l < 16; ++l) {  // (dot * sc * d) * dx - (mn * dmin) * (dx * bsum)
                const __m512 dx = l < 8 ? dx0 : dx1;
                const float bs = l < 8 || two ? xq.bsum[at + l] : 0.0f;
                const __m512 dots = _mm512_mul_ps(_mm512_cvtepi32_ps(
                    _mm512_load_si512(c + (2 * pair * 8 + l) * 256)), _mm512_load_ps(f + 16 * l));
                acc[l] = _mm512_fnmadd_ps(_mm512_load_ps(f + 256 + 16 * l), _mm512_set1_ps(bs),
                                          _mm512_fmadd_ps(dots, dx, acc[l]));
            }
        }
        __m512 t[8];
        for (int i = 0; i < 8; ++i) t[i] = _mm512_add_ps(acc[i], acc[i + 8]);
        for (int i = 0; i < 4; ++i) t[i] = _mm512_add_ps(t[i], t[i + 4]);
        const __m512 r = _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]));
        _mm512_mask_storeu_ps(y + (int64_t)m * N + n0, live, _mm512_add_ps(r, b));
    }
    free(cb);
    free(fac);
}

#undef ANVE_AMX_FOUR
#endif

// The rows from m0 on.
QuantRows rows_from(const QuantRows &q, int m0, int K) {
    const int64_t G = K / GROUP;
    return {q.codes + m0 * (int64_t)K, q.scale + m0 * G, q.sum + m0 * G,
            q.flipped + m0 * (int64_t)K};
}

QuantRows256 rows_from(const QuantRows256 &q, int m0, int K) {
    return {q.codes + m0 * (int64_t)K, q.scale + m0 * (int64_t)(K / SUPER),
            q.bsum + m0 * (int64_t)(K / GROUP), q.gscale + m0 * (int64_t)(K / GROUP),
            q.flipped + m0 * (int64_t)K, nullptr,  // the tiles take all rows at once
            q.slotted ? q.slotted + m0 * (int64_t)K : nullptr,
            q.low32 ? q.low32 + m0 * (int64_t)(K / 8) : nullptr};
}

// Output feature n, whose arrays are w, as the 256-bit builds compute it (q6k_one_vnni
// with VNNI, else q6k_few or q6k_many: see q4k_many).
template <int M>
inline void q6k_one_256(const QuantRows256 xq, int K, const Q6KRow w, const float *bias,
                        float *y, int N, int n) {
#if ANVE_VNNI
    q6k_one_vnni<M>(xq, K, w, bias, y, N, n);
#else
    if constexpr (M <= FEW) q6k_few<M>(xq, K, w, bias, y, N, n);
    else q6k_many<M>(xq, K, w, bias, y, N, n);
#endif
}

template <int M>
void q6k_rows(const QuantRows256 xq, int K, const Q6KWeights w, const float *bias, float *y,
              int N, int n0, int n1) {
    for (int n = n0; n < n1; ++n) {
#if ANVE_AVX512
        q6k_one_512<M>(xq, K, w, bias, y, N, n);
#else
        const Q6KRow row = {w.q + (int64_t)n * K, w.sc + (int64_t)n * (K / 16),
                            w.d + (int64_t)n * (K / SUPER)};
        q6k_one_256<M>(xq, K, row, bias, y, N, n);
#endif
    }
}

// --- q6kp: Q6_K's codes in their 6 bits ------------------------------------------------
//
// The same weights as q6k with each code in 6 bits instead of a byte: 192 bytes of codes
// per super-block against 256, a quarter less to read where one row's pass is bound by
// memory. A super-block is one block of Q6P_BLOCK bytes, the GGUF's 210, so that a
// feature reads one stream (separate arrays of scales and d cost the one-row step several
// per cent on Zen 4). Its first 192 bytes: u = code + 32 (0..63) of its 256 codes in
// Q6P_ORDER (kernel order vectors 0, 2, 1, 3, 4, 6, 5, 7: the order the AVX-512 loop
// pairs them in); byte j < 128 holds u[j] & 15 in its low nibble and u[j + 128] & 15 in
// its high one; byte 128 + j (j < 64) holds the top two bits of u[j], u[j + 64],
// u[j + 128] and u[j + 192] in its bit pairs 0-1, 2-3, 4-5 and 6-7. Then its 16 int8
// scales and its d as float16. Every build computes exactly q6k's integers and float
// steps from them: the same bits as q6k.
struct Q6KPWeights {
    const uint8_t *q;  // [N, K / 256 * Q6P_BLOCK]
};

constexpr int Q6P_BYTES = SUPER * 3 / 4;  // the codes of a block
constexpr int Q6P_BLOCK = Q6P_BYTES + 16 + 2;  // codes, scales, d
constexpr int Q6P_AHEAD = 8 * Q6P_BLOCK;  // bytes the loops prefetch ahead: 8 super-blocks
constexpr int Q6P_ORDER[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // kernel vector of each 32 bytes of u

// The 256 codes (-32..31, kernel order, as q6k holds them) of the packed super-block p.
inline void unpack_q6p(const uint8_t *p, int8_t *out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    const __m256i off = _mm256_set1_epi8(32);
    for (int c = 0; c < 2; ++c) {  // u's 32-byte pieces c, 2 + c, 4 + c, 6 + c
        const __m256i la = _mm256_loadu_si256((const __m256i *)(p + GROUP * c));
        const __m256i lb = _mm256_loadu_si256((const __m256i *)(p + 64 + GROUP * c));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 128 + GROUP * c));
        const __m256i u[4] = {
            _mm256_or_si256(_mm256_and_si256(la, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), top2)),
            _mm256_or_si256(_mm256_and_si256(lb, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), top2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low4), _mm256_and_si256(h, top2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(h, 2), top2))};
        for (int i = 0; i < 4; ++i)
            _mm256_storeu_si256((__m256i *)(out + Q6P_ORDER[2 * i + c] * GROUP), _mm256_sub_epi8(u[i], off));
    }
}

#if ANVE_AVX512
// q6kp on 512-bit vectors: a super-block's u unpacked into the four vectors q6k_one_512
// pairs its codes in, unsigned (0..63), against the signed activations in slot order;
// each row's lanes start from -32 times the sum of their activations (low32), so a half's
// two vpdpbusd leave sum x * (u - 32), q6k_one_512's very integers, with no work on the
// weights' own sum; its float steps follow unchanged.
template <int M>
inline void q6kp_one_512(const QuantRows256 xq, int K, const Q6KPWeights w, const float *bias,
                         float *y, int N, int n) {
    const int S = K / SUPER;
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int sb = 0; sb < S; ++sb) {
        const int64_t at = (int64_t)n * S + sb;
        const uint8_t *p = w.q + at * Q6P_BLOCK;
        prefetch((const char *)p + Q6P_AHEAD, Q6P_BLOCK);
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(p + Q6P_BYTES));
        const __m512i l0 = _mm512_loadu_si512((const void *)p);
        const __m512i l1 = _mm512_loadu_si512((const void *)(p + 64));
        const __m512i h = _mm512_loadu_si512((const void *)(p + 128));
        // (a & low4) | b, b already masked: ternary logic 0xEC on (a, b, low4)
        const __m512i u[4] = {
            _mm512_ternarylogic_epi32(l0, _mm512_and_si512(_mm512_slli_epi16(h, 4), top2), low4, 0xEC),
            _mm512_ternarylogic_epi32(l1, _mm512_and_si512(_mm512_slli_epi16(h, 2), top2), low4, 0xEC),
            _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4), _mm512_and_si512(h, top2), low4, 0xEC),
            _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4),
                                      _mm512_and_si512(_mm512_srli_epi16(h, 2), top2), low4, 0xEC)};
        __m512 scale[2];
        for (int half = 0; half < 2; ++half)
            scale[half] = _mm512_cvtepi32_ps(_mm512_broadcast_i64x4(half_scales32(sc16, half)));
        __m512i wq[4], minus[2];  // (many rows) q6k_one_512's signed codes and -128 * sum w
        if constexpr (M > Q6P_LOW_ROWS) {
            const __m512i off = _mm512_set1_epi8(32), flip = _mm512_set1_epi8((char)0x80);
            for (int i = 0; i < 4; ++i) wq[i] = _mm512_sub_epi8(u[i], off);
            for (int half = 0; half < 2; ++half)
                minus[half] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, wq[2 * half]), flip,
                    wq[2 * half + 1]));
        }
        const float d = half_at(p + Q6P_BYTES + 16);
        for (int m = 0; m < M; ++m) {
            __m512i dots[2];
            if constexpr (M > Q6P_LOW_ROWS) {
                const int8_t *x = xq.flipped + m * (int64_t)K + sb * SUPER;
                for (int half = 0; half < 2; ++half) {
                    dots[half] = _mm512_dpbusd_epi32(minus[half],
                        _mm512_loadu_si512((const void *)(x + 128 * half)), wq[2 * half]);
                    dots[half] = _mm512_dpbusd_epi32(dots[half],
                        _mm512_loadu_si512((const void *)(x + 128 * half + 64)), wq[2 * half + 1]);
                }
            } else {
                const int8_t *x = xq.slotted + m * (int64_t)K + sb * SUPER;
                const int32_t *low = xq.low32 + ((int64_t)m * S + sb) * 32;
                for (int half = 0; half < 2; ++half) {
                    dots[half] = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(low + 16 * half)),
                        u[2 * half], _mm512_loadu_si512((const void *)(x + 128 * half)));
                    dots[half] = _mm512_dpbusd_epi32(dots[half], u[2 * half + 1],
                        _mm512_loadu_si512((const void *)(x + 128 * half + 64)));
                }
            }
            acc[m] = q6k_fold_512(dots, scale, d * xq.scale[(int64_t)m * S + sb], acc[m]);
        }
    }
    put_rows_512(acc, bias, y, N, n);
}
#endif

template <int M>
void q6kp_rows(const QuantRows256 xq, int K, const Q6KPWeights w, const float *bias, float *y,
               int N, int n0, int n1) {
#if ANVE_AVX512
    for (int n = n0; n < n1; ++n) q6kp_one_512<M>(xq, K, w, bias, y, N, n);
#else
    // the 256-bit builds unpack a feature into q6k's arrays and run q6k's loop
    const int S = K / SUPER;
    thread_local std::vector<int8_t> codes, scales;
    thread_local std::vector<float> ds;
    codes.resize((size_t)K), scales.resize((size_t)K / 16), ds.resize((size_t)S);
    const Q6KRow row = {codes.data(), scales.data(), ds.data()};
    for (int n = n0; n < n1; ++n) {
        for (int sb = 0; sb < S; ++sb) {
            const uint8_t *p = w.q + ((int64_t)n * S + sb) * Q6P_BLOCK;
            unpack_q6p(p, codes.data() + sb * SUPER);
            memcpy(scales.data() + 16 * sb, p + Q6P_BYTES, 16);
            ds[sb] = half_at(p + Q6P_BYTES + 16);
        }
        q6k_one_256<M>(xq, K, row, bias, y, N, n);
    }
#endif
}

#if ANVE_AVX512
// q8 on 512-bit vectors, 16 groups at a time: each four groups' 128 bytes of weights
// are permuted (once for all rows) into the order the activations sit in (group_low),
// the flipped activations (x + 128) against the signed weights give four int32 lanes
// per group less the weights' own 128 * sum w, and sum_fours gathers 16 groups' sums
// for one multiply-add by dx; groups left over go as the other builds take them.
template <int M>
void q8_rows_512(const QuantRows xq, int K, const int8_t *codes, const float *scale,
                 const float *bias, float *y, int N, int n0, int n1) {
    const int G = K / GROUP;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i firsts = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13);  // 16-byte halves
    const __m512i seconds = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int n = n0; n < n1; ++n) {
        __m512 acc[M];
        __m256 rest[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps(), rest[m] = _mm256_setzero_ps();
        const int8_t *wrow = codes + (int64_t)n * K;
        int g = 0;
        for (; g + 16 <= G; g += 16) {
            prefetch((const char *)(wrow + g * GROUP) + 8 * 16 * GROUP, 16 * GROUP);
            __m512i first[4], second[4], minus[4];
            for (int q = 0; q < 4; ++q) {
                const int8_t *w = wrow + (g + 4 * q) * GROUP;
                const __m512i a = _mm512_loadu_si512((const void *)w);
                const __m512i b = _mm512_loadu_si512((const void *)(w + 2 * GROUP));
                first[q] = _mm512_permutex2var_epi64(a, firsts, b);
                second[q] = _mm512_permutex2var_epi64(a, seconds, b);
                minus[q] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, first[q]), flip, second[q]));
            }
            for (int m = 0; m < M; ++m) {
                const int8_t *x = xq.flipped + ((int64_t)m * G + g) * GROUP;
                __m512i a[4];
                for (int q = 0; q < 4; ++q)
                    a[q] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(minus[q],
                        _mm512_loadu_si512((const void *)(x + 4 * q * GROUP)), first[q]),
                        _mm512_loadu_si512((const void *)(x + 4 * q * GROUP + 2 * GROUP)), second[q]);
                const __m512 dx = _mm512_permutexvar_ps(order, _mm512_loadu_ps(xq.scale + (int64_t)m * G + g));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_fours(a)), dx, acc[m]);
            }
        }
        for (; g < G; ++g) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(wrow + g * GROUP));
            const __m256i w_abs = _mm256_sign_epi8(w, w);
            const int64_t low = group_low(g, G), high = group_high(g, G);
            for (int m = 0; m < M; ++m) {
                const int64_t mg = (int64_t)m * G + g;
                const int8_t *row = xq.codes + (int64_t)m * K;
                const __m256i x = _mm256_loadu2_m128i((const __m128i *)(row + high),
                                                      (const __m128i *)(row + low));
                const __m256i p32 = dpbusd(_mm256_setzero_si256(), w_abs, _mm256_sign_epi8(x, w));
                rest[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(xq.scale[mg]), rest[m]);
            }
        }
        const float b = bias ? bias[n] : 0.0f;
        for (int m = 0; m < M; ++m)
            y[(int64_t)m * N + n] = (_mm512_reduce_add_ps(acc[m]) + hsum(rest[m])) * scale[n] + b;
    }
}
#endif

template <int M>
void q8_rows(const QuantRows xq, int K, const int8_t *codes, const float *scale,
             const float *bias, float *y, int N, int n0, int n1) {
#if ANVE_AVX512
    return q8_rows_512<M>(xq, K, codes, scale, bias, y, N, n0, n1);
#endif
    const int G = K / GROUP;
    for (int n = n0; n < n1; ++n) {
        __m256 acc[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
        const int8_t *wrow = codes + (int64_t)n * K;
        for (int g = 0; g < G; ++g) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(wrow + g * GROUP));
            const __m256i w_abs = _mm256_sign_epi8(w, w);
            const int64_t low = group_low(g, G), high = group_high(g, G);
            for (int m = 0; m < M; ++m) {
                const int64_t mg = (int64_t)m * G + g;
                const int8_t *row = xq.codes + (int64_t)m * K;
                const __m256i x = _mm256_loadu2_m128i((const __m128i *)(row + high),
                                                      (const __m128i *)(row + low));
#if ANVE_VNNI
                const __m256i p32 = dpbusd(_mm256_setzero_si256(), w_abs, _mm256_sign_epi8(x, w));
#else
                const __m256i p16 = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
                const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
#endif
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32),
                                         _mm256_set1_ps(xq.scale[mg]), acc[m]);
            }
        }
        const float b = bias ? bias[n] : 0.0f;
        for (int m = 0; m < M; ++m) y[(int64_t)m * N + n] = hsum(acc[m]) * scale[n] + b;
    }
}


// Dot product of two float vectors of n (a multiple of 8), in a fixed order: four
// accumulators over 32 at a time (the FMA latency hides behind the other three).
inline float dot8(const float *a, const float *b, int n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int c = 0; c < 4; ++c)
            acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * c),
                                     _mm256_loadu_ps(b + i + 8 * c), acc[c]);
    for (; i < n; i += 8)
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// The cached positions one query row attends to, in ascending order: the first
// `prefix` positions, then `picked` more at pick[0 ..] (a draft tree's ancestors).
struct Seen {
    int prefix;
    const int *pick;
    int picked;
    int len() const { return prefix + picked; }
    int64_t at(int j) const { return j < prefix ? j : pick[j - prefix]; }
};

// acc[c] += sum_{j0 <= j < j1} scores[j] * v[seen j, i0 + 8c ..], j in ascending order: C
// independent accumulators over a span of the seen positions (spans taken in order add up
// to the whole sum, operation by operation).
template <int C>
inline void weighted_span(const float *scores, const float *v, const Seen &seen, int Dh, int i0,
                          int j0, int j1, __m256 *acc) {
    __m256 a[C];
    for (int c = 0; c < C; ++c) a[c] = acc[c];
    for (int j = j0; j < j1; ++j) {
        const __m256 s = _mm256_set1_ps(scores[j]);
        const float *row = v + seen.at(j) * Dh + i0;
        for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(s, _mm256_loadu_ps(row + 8 * c), a[c]);
    }
    for (int c = 0; c < C; ++c) acc[c] = a[c];
}

// Seen positions a span of attend_heads takes at a time: 64 rows of keys or values of 128
// floats (32 KiB) stay in L1 while every head of the group reads them.
constexpr int SPAN = 64;

// The most (row, head) pairs attend_heads takes in one call.
constexpr int MAX_PAIRS = 128;

// Query rows and heads that share one key/value head (grouped-query attention, and the
// rows of one step), each pair alone: out[p][Dh] = softmax(q[p] . K[seen p]^T * scaling) .
// V[seen p] for p < P (P <= MAX_PAIRS). The positions are taken a span at a time for all
// P pairs, so each span of the cache is read once for them, where one pair at a time read
// all of it P times over (from L2 or L3 on a long context). Every pair's every operation
// is the one it runs alone, in the same order (a dot product per position; then the
// softmax; then per 64 output values one sum over its positions in ascending order), and
// depends only on how many positions it sees, so a row that sees its ancestors scattered
// in the cache gets what it gets with them contiguous. scores: P * (the longest seen)
// floats; acc: P * Dh / 8 vectors of scratch.
void attend_heads(const float *const *q, const Seen *const *seen, int P, const float *k,
                  const float *v, int Dh, float scaling, float *scores, __m256 *acc,
                  float *const *out) {
    int longest = 0, len[MAX_PAIRS];
    float top[MAX_PAIRS], inv[MAX_PAIRS];
    for (int p = 0; p < P; ++p) {
        len[p] = seen[p]->len();
        longest = len[p] > longest ? len[p] : longest;
        top[p] = -INFINITY;
    }
    for (int j0 = 0; j0 < longest; j0 += SPAN) {
        for (int p = 0; p < P; ++p) {
            float *sc = scores + (int64_t)p * longest;
            const int j1 = j0 + SPAN < len[p] ? j0 + SPAN : len[p];
            for (int j = j0; j < j1; ++j) {
                sc[j] = dot8(q[p], k + seen[p]->at(j) * Dh, Dh) * scaling;
                top[p] = sc[j] > top[p] ? sc[j] : top[p];
            }
        }
    }
    for (int p = 0; p < P; ++p) {
        float *sc = scores + (int64_t)p * longest;
        const __m256 vtop = _mm256_set1_ps(top[p]);
        __m256 sums = _mm256_setzero_ps();
        int j = 0;
        for (; j + 8 <= len[p]; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vtop));
            _mm256_storeu_ps(sc + j, e);
            sums = _mm256_add_ps(sums, e);
        }
        float total = hsum(sums);
        for (; j < len[p]; ++j) {
            sc[j] = expf(sc[j] - top[p]);
            total += sc[j];
        }
        inv[p] = 1.0f / total;
    }
    const int vecs = Dh / 8;
    for (int i = 0; i < P * vecs; ++i) acc[i] = _mm256_setzero_ps();
    for (int j0 = 0; j0 < longest; j0 += SPAN) {
        for (int p = 0; p < P; ++p) {
            const int j1 = j0 + SPAN < len[p] ? j0 + SPAN : len[p];
            if (j1 <= j0) continue;
            const float *sc = scores + (int64_t)p * longest;
            __m256 *a = acc + (int64_t)p * vecs;
            int i = 0;
            for (; i + 64 <= Dh; i += 64) weighted_span<8>(sc, v, *seen[p], Dh, i, j0, j1, a + i / 8);
            for (; i < Dh; i += 8) weighted_span<1>(sc, v, *seen[p], Dh, i, j0, j1, a + i / 8);
        }
    }
    for (int p = 0; p < P; ++p)
        for (int i = 0; i < vecs; ++i)
            _mm256_storeu_ps(out[p] + 8 * i, _mm256_mul_ps(acc[(int64_t)p * vecs + i],
                                                           _mm256_set1_ps(inv[p])));
}

// Per thread: attend_heads' scores and sums for `pairs` pairs over up to `len` positions,
// kept between calls (a step calls attention once a layer; a fresh buffer for a long
// context's scores would cost its page faults every time).
struct AttendScratch {
    float *scores;
    __m256 *acc;
    AttendScratch(int pairs, int len, int Dh) {
        thread_local std::vector<float> s;
        thread_local std::vector<__m256> a;
        const size_t n = (size_t)pairs * (size_t)(len > 0 ? len : 1);
        const size_t m = (size_t)pairs * (size_t)(Dh / 8);
        if (s.size() < n) s.resize(n);
        if (a.size() < m) a.resize(m);
        scores = s.data();
        acc = a.data();
    }
};

// Query rows one attention task takes at most (with a group's heads, at most MAX_PAIRS).
constexpr int ROWS_A_TASK = 16;

// The most query heads of one key/value head a task takes (the size of a task's arrays).
constexpr int MAX_PART = 32;

// How the `group` query heads of a key/value head are split into tasks: into `parts` of
// `per` heads (the last may hold fewer, none is empty), where `whole` tasks of a whole
// group each would leave threads idle (one row over two key/value heads), and into parts
// of at most MAX_PART heads.
struct HeadParts {
    int group, per, parts;
    HeadParts(int whole, int group_) : group(group_) {
        const int threads = omp_get_max_threads();
        int wanted = whole >= threads ? 1 : (threads + whole - 1) / whole;
        wanted = wanted < group ? wanted : group;
        per = (group + wanted - 1) / wanted;
        per = per < MAX_PART ? per : MAX_PART;
        parts = (group + per - 1) / per;
    }
    int first(int part) const { return part * per; }  // within the group
    int count(int part) const { return (part + 1) * per < group ? per : group - part * per; }
};

// --- elementwise pieces of a decoder layer (one row at a time, fixed order) ----------

// y[t] = w * (x[t] * r), r = 1 / sqrt(mean(x[t]^2) + eps), for T rows of n (a multiple of 8).
void rms_norm(const float *x, const float *w, float *y, int T, int n, float eps) {
    for (int t = 0; t < T; ++t) {
        const float *xr = x + (int64_t)t * n;
        float *yr = y + (int64_t)t * n;
        const float r = 1.0f / sqrtf(dot8(xr, xr, n) / (float)n + eps);
        const __m256 vr = _mm256_set1_ps(r);
        for (int i = 0; i < n; i += 8) {
            const __m256 xi = _mm256_mul_ps(_mm256_loadu_ps(xr + i), vr);
            _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), xi));
        }
    }
}

// gate[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up, for n (a multiple of 8).
void silu_mul(float *gate, const float *up, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 16384)
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
}

// Rotary embedding of one head vector (Dh floats) at one position: out = x * c +
// rotate_half(x) * s, rotate_half(x) = (-x[half:], x[:half]), as transformers computes it.
void rotate(const float *x, const float *c, const float *s, int Dh, float *out) {
    const int half = Dh / 2;
    for (int i = 0; i < half; ++i) {
        out[i] = x[i] * c[i] - x[i + half] * s[i];
        out[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
    }
}

void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}

// One allocation for the rounded activations: codes [M, K], then 2 * M * K / 32 floats.
struct Scratch {
    char *block;
    int64_t codes_bytes, float_bytes;
    int64_t tile_bytes;  // the tiles' codes (amx, from AMX_FROM rows on), after the rest
    Scratch(int M, int K) {
#if ANVE_AMX
        const int64_t padded = amx_padded(M);  // whole sets of tile rows, the rest zero
#else
        const int64_t padded = 0;
#endif
        codes_bytes = ((int64_t)M * K + 63) / 64 * 64;
        float_bytes = (3 * (int64_t)M * (K / GROUP) * 4 + 63) / 64 * 64;
        tile_bytes = padded * K;
        const int64_t bytes = codes_bytes * (ANVE_AVX512 ? 2 : 1) + float_bytes + tile_bytes
                              + (ANVE_AVX512 ? packed6_bytes() : 0);
        block = (char *)aligned_alloc(64, (size_t)(bytes > 64 ? bytes : 64));
        if (padded > M)  // rows past M of the tiles' codes: zero
            memset(block + 2 * codes_bytes + float_bytes, 0, (size_t)tile_bytes);
    }
    // q6kp_one_512's slotted codes and low32 sums (AVX-512), after everything else
    int64_t packed6_bytes() const { return codes_bytes + codes_bytes / 2; }
    ~Scratch() { free(block); }
    QuantRows rows(int M, int K) const {
        float *scale = (float *)(block + codes_bytes);
        return {(int8_t *)block, scale, scale + (int64_t)M * (K / GROUP),
                (int8_t *)(block + codes_bytes + float_bytes)};
    }
    QuantRows256 rows256(int M, int K) const {
        float *scale = (float *)(block + codes_bytes), *bsum = scale + (int64_t)M * (K / SUPER);
        char *packed6 = block + 2 * codes_bytes + float_bytes + tile_bytes;
        return {(int8_t *)block, scale, bsum, bsum + (int64_t)M * (K / GROUP),
                (int8_t *)(block + codes_bytes + float_bytes),
                tile_bytes ? (int8_t *)(block + 2 * codes_bytes + float_bytes) : nullptr,
                ANVE_AVX512 ? (int8_t *)packed6 : nullptr,
                ANVE_AVX512 ? (int32_t *)(packed6 + codes_bytes) : nullptr};
    }
};

}  // namespace

// f(std::integral_constant<int, mm>) for 1 <= mm <= MAX_M: a kernel template compiled
// for each row count a pass can hold.
template <int M = 1, class F>
inline void with_rows(int mm, F &&f) {
    if constexpr (M < MAX_M) {
        if (mm > M) return with_rows<M + 1>(mm, f);
    }
    f(std::integral_constant<int, M>{});
}

#define DISPATCH(FN, ...) with_rows(mm, [&](auto rows) { FN<decltype(rows)::value>(__VA_ARGS__); });

extern "C" {

int anve_qdot_version(void) { return 17; }

// Whether this copy can run here: the amx build needs the OS's leave to use tile data
// (asked for when the library loads); the others always can.
int anve_qdot_ready(void) {
#if ANVE_AMX
    return amx_ready ? 1 : 0;
#else
    return 1;
#endif
}

// The instruction set this copy was compiled for: "avx2", "avxvnni", "avx512" or "amx".
const char *anve_qdot_variant(void) { return ANVE_VARIANT; }

// Rows one pass over the weights holds.
int anve_qdot_max_rows(void) { return MAX_M; }

// One linear layer of a call: its weight form, N, weight arrays (in the order of the
// forms above), optional bias [N] and output y [M, N].
// The format ids come from engine/cpu/formats.py (kernels.py passes -DANVE_FORM_<NAME>).
#if !defined(ANVE_FORM_Q4) || !defined(ANVE_FORM_Q8) || !defined(ANVE_FORM_Q4K) || \
    !defined(ANVE_FORM_Q6K) || !defined(ANVE_FORM_Q6KP)
#error "build with the format ids of engine/cpu/formats.py (-DANVE_FORM_Q4=... and so on)"
#endif
enum Form { FORM_Q4 = ANVE_FORM_Q4, FORM_Q8 = ANVE_FORM_Q8, FORM_Q4K = ANVE_FORM_Q4K,
            FORM_Q6K = ANVE_FORM_Q6K, FORM_Q6KP = ANVE_FORM_Q6KP };
struct Part {
    int form;
    int n;
    const void *w[5];
    const float *bias;
    float *y;
};

void part_tile(const Part &p, int M, int K, const QuantRows &r32, const QuantRows256 &r256,
               int n0, int n1) {
#if ANVE_AMX
    if (p.form == FORM_Q4K && M >= AMX_FROM) {  // all rows in one pass, on tiles
        const Q4KWeights w = {(const uint8_t *)p.w[0], (const uint8_t *)p.w[1]};
        return q4k_amx(r256, M, K, w, p.bias, p.y, p.n, n0, n1);
    }
#endif
    const int passes = (M + MAX_M - 1) / MAX_M;
    for (int pass = 0, m0 = 0; pass < passes; ++pass) {  // rows m0 .. m0 + mm - 1
        const int mm = (M - m0) / (passes - pass) + ((M - m0) % (passes - pass) ? 1 : 0);
        float *out = p.y + (int64_t)m0 * p.n;
        const int N = p.n;
        if (p.form == FORM_Q4) {
            const QuantRows xq = rows_from(r32, m0, K);
            DISPATCH(q4_rows, xq, K, (const uint8_t *)p.w[0], (const uint16_t *)p.w[1],
                     (const uint16_t *)p.w[2], p.bias, out, N, n0, n1)
        } else if (p.form == FORM_Q8) {
            const QuantRows xq = rows_from(r32, m0, K);
            DISPATCH(q8_rows, xq, K, (const int8_t *)p.w[0], (const float *)p.w[1], p.bias, out,
                     N, n0, n1)
        } else if (p.form == FORM_Q4K) {
            const QuantRows256 xq = rows_from(r256, m0, K);
            const Q4KWeights w = {(const uint8_t *)p.w[0], (const uint8_t *)p.w[1]};
            DISPATCH(q4k_rows, xq, K, w, p.bias, out, N, n0, n1)
        } else if (p.form == FORM_Q6K) {
            const QuantRows256 xq = rows_from(r256, m0, K);
            const Q6KWeights w = {(const int8_t *)p.w[0], (const int8_t *)p.w[1],
                                  (const float *)p.w[2]};
            DISPATCH(q6k_rows, xq, K, w, p.bias, out, N, n0, n1)
        } else {
            const QuantRows256 xq = rows_from(r256, m0, K);
            const Q6KPWeights w = {(const uint8_t *)p.w[0]};
            DISPATCH(q6kp_rows, xq, K, w, p.bias, out, N, n0, n1)
        }
        m0 += mm;
    }
}

// y_p[M, N_p] = x[M, K] . W_p^T (+ bias_p) for every part p, in one pass of threads:
// the activations are rounded once (per 32 for q4/q8, per 256 for q4k/q6k; K a multiple
// of that) and the parts' tiles of output features are shared out together, so layers
// that read the same input (q, k, v; gate, up) cost one call. Each output element is
// computed exactly as a call with that part alone computes it.
constexpr int TILE = 16;  // output features per scheduled chunk

inline int tiles_of(const Part &p) { return (p.n + TILE - 1) / TILE; }

void anve_linear_parts(const float *x, int M, int K, int n_parts, const Part *parts) {
    bool per32 = false, per256 = false, packed6 = false;
    int tiles = 0;
    for (int i = 0; i < n_parts; ++i) {
        const int form = parts[i].form;
        const bool coarse = form == FORM_Q4K || form == FORM_Q6K || form == FORM_Q6KP;
        per256 |= coarse;
        per32 |= !coarse;
        packed6 |= form == FORM_Q6KP && M <= Q6P_LOW_ROWS;  // (a pass holds M rows then)
        tiles += tiles_of(parts[i]);
    }
    Scratch s32(per32 ? M : 0, K), s256(per256 ? M : 0, K);
    const QuantRows r32 = s32.rows(M, K);
    const QuantRows256 r256 = s256.rows256(M, K);
    if (per32) quantize_rows(x, M, K, r32);
    if (per256) quantize_rows_256(x, M, K, r256, packed6);
#if ANVE_AMX
    bool on_tiles = false;  // some part takes its sums from tiles (see part_tile)
    for (int i = 0; i < n_parts; ++i) on_tiles |= parts[i].form == FORM_Q4K && M >= AMX_FROM;
#endif
#pragma omp parallel
    {
#if ANVE_AMX
        if (on_tiles) configure_tiles(amx_rows(M));
#endif
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; ++t) {
            int i = 0, first = 0;  // part i holds tiles first .. first + its tile count - 1
            while (t - first >= tiles_of(parts[i])) first += tiles_of(parts[i++]);
            const int n0 = (t - first) * TILE, n1 = n0 + TILE < parts[i].n ? n0 + TILE : parts[i].n;
            part_tile(parts[i], M, K, r32, r256, n0, n1);
        }
#if ANVE_AMX
        if (on_tiles) _tile_release();
#endif
    }
}

// out[T, H, Dh] = attention of q[H, T, Dh] over the cache k, v [Hkv, >= L, Dh] (head h
// starts at h * head_stride floats; positions Dh apart): query row t sees positions
// 0 .. L - T + t, or with tree (T <= 32 masks) 0 .. L - T - 1 and L - T + j for each bit
// j of tree[t]. H a multiple of Hkv (grouped heads), Dh a multiple of 8.
void anve_row_attention(const float *q, const float *k, const float *v, float *out, int H,
                        int Hkv, int T, int L, int Dh, int64_t head_stride, float scaling,
                        const uint32_t *tree) {
    const int group = H / Hkv;
    // tasks: (block of rows, key/value head, part of its query heads); the rows of a block
    // and the heads of a part read the cache together (attend_heads)
    int rows = T < ROWS_A_TASK ? T : ROWS_A_TASK;
    const HeadParts split(Hkv * ((T + rows - 1) / rows), group);
    rows = rows < MAX_PAIRS / split.per ? rows : MAX_PAIRS / split.per;
    const int blocks = (T + rows - 1) / rows, parts = split.parts;
#pragma omp parallel
    {
        AttendScratch scratch(rows * split.per, L, Dh);
        int pick[ROWS_A_TASK][32];
        Seen seen[ROWS_A_TASK];
        const Seen *seens[MAX_PAIRS];
        const float *qs[MAX_PAIRS];
        float *outs[MAX_PAIRS];
#pragma omp for schedule(static)
        for (int task = 0; task < blocks * Hkv * parts; ++task) {
            const int block = task / (Hkv * parts), kv = task / parts % Hkv, part = task % parts;
            const int h0 = kv * group + split.first(part), g = split.count(part);
            const int t0 = block * rows, t1 = t0 + rows < T ? t0 + rows : T;
            int P = 0;
            for (int t = t0; t < t1; ++t) {
                Seen &st = seen[t - t0];
                st = {L - T + t + 1, pick[t - t0], 0};
                if (tree) {  // the cache before this step, then the new rows row t sees
                    st.prefix = L - T;
                    for (int j = 0; j < T; ++j)
                        if (tree[t] >> j & 1u) pick[t - t0][st.picked++] = L - T + j;
                }
                for (int i = 0; i < g; ++i, ++P) {
                    seens[P] = &st;
                    qs[P] = q + ((int64_t)(h0 + i) * T + t) * Dh;
                    outs[P] = out + ((int64_t)t * H + h0 + i) * Dh;
                }
            }
            attend_heads(qs, seens, P, k + kv * head_stride, v + kv * head_stride, Dh, scaling,
                         scratch.scores, scratch.acc, outs);
        }
    }
}

// One decoder layer's weights and its KV cache (the C side of engine/cpu/kernels.py's
// DecoderLayer, filled by engine/cpu/forward.py).
struct DecoderLayer {
    const float *norm1, *norm2;  // [hidden] RMSNorm weights
    Part qkv[3];                  // q [H * Dh], k, v [Hkv * Dh] (their y set per call)
    Part o;                       // [hidden]
    Part gate_up[2];              // [inter] each
    Part down;                    // [hidden]
    float *kbuf, *vbuf;           // [Hkv, capacity, Dh]
    int64_t head_stride;          // capacity * Dh
};

struct DecoderModel {
    int n_layers, hidden, heads, kv_heads, head_dim, inter;
    float eps, scaling;
    DecoderLayer *layers;
};

// The scratch rows of one step, and the two halves of a layer around its attention:
// anve_decoder_step and anve_decoder_step_seqs run the very same code through them.
struct StepRows {
    float *block, *h, *q, *k, *v, *qr, *att, *o, *gate, *up;
    StepRows(const DecoderModel *m, int T) {
        const int64_t hd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
        const int64_t sizes[] = {m->hidden, hd, kvd, kvd, hd, hd, m->hidden, m->inter, m->inter};
        int64_t total = 0;
        for (int64_t n : sizes) total += n * T;
        block = (float *)aligned_alloc(64, (size_t)((total * 4 + 63) / 64 * 64));
        h = block, q = h + (int64_t)T * m->hidden, k = q + (int64_t)T * hd;
        v = k + (int64_t)T * kvd, qr = v + (int64_t)T * kvd, att = qr + (int64_t)T * hd;
        o = att + (int64_t)T * hd, gate = o + (int64_t)T * m->hidden;
        up = gate + (int64_t)T * m->inter;
    }
    ~StepRows() { free(block); }
};

// RMSNorm of rows x[T], then q, k, v into s.q, s.k, s.v in one call.
static void layer_qkv(const DecoderModel *m, const DecoderLayer &L, const float *x, int T,
                      StepRows &s) {
    rms_norm(x, L.norm1, s.h, T, m->hidden, m->eps);
    Part qkv[3] = {L.qkv[0], L.qkv[1], L.qkv[2]};
    qkv[0].y = s.q, qkv[1].y = s.k, qkv[2].y = s.v;
    anve_linear_parts(s.h, T, m->hidden, 3, qkv);
}

// After the attention (its output in s.att): o, the residual, RMSNorm, gate/up, SiLU * up,
// down and the residual, into x[T] in place.
static void layer_rest(const DecoderModel *m, const DecoderLayer &L, float *x, int T,
                       StepRows &s) {
    Part op = L.o;
    op.y = s.o;
    anve_linear_parts(s.att, T, m->heads * m->head_dim, 1, &op);
    add_into(x, s.o, (int64_t)T * m->hidden);
    rms_norm(x, L.norm2, s.h, T, m->hidden, m->eps);
    Part gu[2] = {L.gate_up[0], L.gate_up[1]};
    gu[0].y = s.gate, gu[1].y = s.up;
    anve_linear_parts(s.h, T, m->hidden, 2, gu);
    silu_mul(s.gate, s.up, (int64_t)T * m->inter);
    Part dp = L.down;
    dp.y = s.o;
    anve_linear_parts(s.gate, T, m->inter, 1, &dp);
    add_into(x, s.o, (int64_t)T * m->hidden);
}

// x[T, hidden] (in place) through every layer for new positions start .. start + T - 1,
// their rotary cos, sin [T, Dh] given (a tree row's at its depth); each layer's cache must
// hold room for start + T positions and gets the new keys and values written there (row
// t at start + t); tree as for anve_row_attention, or NULL for causal rows. hidden, H * Dh and inter are
// multiples of 256 (q4k/q6k) or 32 (q4/q8) as their parts need, Dh a multiple of 8.
void anve_decoder_step(const DecoderModel *m, float *x, int T, int start, const float *cos,
                       const float *sin, const uint32_t *tree) {
    const int Dh = m->head_dim;
    StepRows s(m, T);
    for (int l = 0; l < m->n_layers; ++l) {
        const DecoderLayer &L = m->layers[l];
        layer_qkv(m, L, x, T, s);
        for (int t = 0; t < T; ++t) {
            const float *c = cos + (int64_t)t * Dh, *sn = sin + (int64_t)t * Dh;
            for (int hh = 0; hh < m->heads; ++hh)  // q as [H, T, Dh] for the attention
                rotate(s.q + ((int64_t)t * m->heads + hh) * Dh, c, sn, Dh,
                       s.qr + ((int64_t)hh * T + t) * Dh);
            for (int kv = 0; kv < m->kv_heads; ++kv) {
                const int64_t at = kv * L.head_stride + (int64_t)(start + t) * Dh;
                const int64_t from = ((int64_t)t * m->kv_heads + kv) * Dh;
                rotate(s.k + from, c, sn, Dh, L.kbuf + at);
                for (int i = 0; i < Dh; ++i) L.vbuf[at + i] = s.v[from + i];
            }
        }
        anve_row_attention(s.qr, L.kbuf, L.vbuf, s.att, m->heads, m->kv_heads, T, start + T, Dh,
                           L.head_stride, m->scaling, tree);
        layer_rest(m, L, x, T, s);
    }
}

// Rows of several sequences in one step (batched decoding): row t belongs to sequence
// seq[t] and sits at position pos[t] of it; in every layer its key and value go to that
// sequence's cache (kbufs / vbufs / strides [n_seq * n_layers], sequence-major) and it
// attends to positions 0 .. pos[t] of that cache. A sequence's rows of one call sit at
// consecutive positions in order (every row's key is written before any row attends).
// The linear layers read their weights once for all rows. Each row goes through exactly
// the operations a one-row anve_decoder_step of its sequence gives it (attend_heads over
// the same number of positions, the same per-row elementwise code), so the row promise
// holds across sequences: a row's bits do not depend on which other rows came with it.
void anve_decoder_step_seqs(const DecoderModel *m, float *x, int T, const int *seq,
                            const int *pos, const float *cos, const float *sin,
                            float *const *kbufs, float *const *vbufs, const int64_t *strides) {
    const int Dh = m->head_dim, group = m->heads / m->kv_heads;
    StepRows s(m, T);
    int longest = 0;
    for (int t = 0; t < T; ++t) longest = pos[t] + 1 > longest ? pos[t] + 1 : longest;
    for (int l = 0; l < m->n_layers; ++l) {
        const DecoderLayer &L = m->layers[l];
        layer_qkv(m, L, x, T, s);
        for (int t = 0; t < T; ++t) {
            const int64_t at_layer = (int64_t)seq[t] * m->n_layers + l;
            float *kb = kbufs[at_layer], *vb = vbufs[at_layer];
            const float *c = cos + (int64_t)t * Dh, *sn = sin + (int64_t)t * Dh;
            for (int hh = 0; hh < m->heads; ++hh)  // q as [T, H, Dh] here
                rotate(s.q + ((int64_t)t * m->heads + hh) * Dh, c, sn, Dh,
                       s.qr + ((int64_t)t * m->heads + hh) * Dh);
            for (int kv = 0; kv < m->kv_heads; ++kv) {
                const int64_t at = kv * strides[at_layer] + (int64_t)pos[t] * Dh;
                const int64_t from = ((int64_t)t * m->kv_heads + kv) * Dh;
                rotate(s.k + from, c, sn, Dh, kb + at);
                for (int i = 0; i < Dh; ++i) vb[at + i] = s.v[from + i];
            }
        }
        const HeadParts split(T * m->kv_heads, group);
#pragma omp parallel
        {
            AttendScratch scratch(split.per, longest, Dh);
            const Seen *seens[MAX_PART];
            const float *qs[MAX_PART];
            float *outs[MAX_PART];
#pragma omp for schedule(static)
            for (int task = 0; task < T * m->kv_heads * split.parts; ++task) {
                const int t = task / (m->kv_heads * split.parts);
                const int kv = task / split.parts % m->kv_heads, part = task % split.parts;
                const int h0 = kv * group + split.first(part), g = split.count(part);
                const int64_t at_layer = (int64_t)seq[t] * m->n_layers + l;
                const int64_t stride = strides[at_layer];
                const Seen seen = {pos[t] + 1, nullptr, 0};
                for (int i = 0; i < g; ++i) {
                    seens[i] = &seen;
                    qs[i] = s.qr + ((int64_t)t * m->heads + h0 + i) * Dh;
                    outs[i] = s.att + ((int64_t)t * m->heads + h0 + i) * Dh;
                }
                attend_heads(qs, seens, g, kbufs[at_layer] + kv * stride,
                             vbufs[at_layer] + kv * stride, Dh, m->scaling, scratch.scores,
                             scratch.acc, outs);
            }
        }
        layer_rest(m, L, x, T, s);
    }
}

}  // extern "C"
