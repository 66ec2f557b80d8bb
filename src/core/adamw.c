#include "adamw.h"
#include "dtype_simd.h"

#include <math.h>
#include <stdint.h>
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ADAMW_X86 1
#else
#define ADAMW_X86 0
#endif

/* Below this many elements the range runs on the calling thread: an OpenMP
 * fork/join costs a few µs, about what 32K elements take. */
#define ADAMW_PARALLEL_MIN 32768
/* Elements per SIMD iteration (64 bytes of fp32) on every level. */
#define ADAMW_VEC 16
/* Software prefetch distance, in elements: 1 KiB ahead in each of p, m, v
 * and g. With the hardware prefetchers alone the pass ran 10-12% slower at
 * 100M parameters (the long sqrt and division latencies keep fewer loads in
 * flight); 128 and 512 measured the same as 256. */
#define ADAMW_PREFETCH_AHEAD 256

/* Where and how the updated parameters go besides param. */
struct adamw_out {
    void *dst;           /* NULL: nowhere */
    enum dtype dtype;
};

/* Which stores of a kernel are non-temporal (the caller checked alignment). */
struct adamw_streaming {
    int state; /* p, m, v (64-byte aligned) */
    int out;   /* param_out (64-byte aligned for fp32, 32 for 16-bit) */
};

typedef void (*adamw_kernel_fn)(float *param, float *m, float *v, const float *grad, size_t n,
                                const struct adamw_coeffs *c, struct adamw_out out, struct adamw_streaming stream);

struct adamw_coeffs adamw_make_coeffs(const struct adamw_hparams *hp)
{
    struct adamw_coeffs c = {
        .beta1 = hp->beta1,
        .one_minus_beta1 = 1.0f - hp->beta1,
        .beta2 = hp->beta2,
        .one_minus_beta2 = 1.0f - hp->beta2,
        .eps = hp->eps,
        .neg_step_size = -(hp->lr / hp->bias_correction1),
        .inv_sqrt_bc2 = 1.0f / sqrtf(hp->bias_correction2),
        .grad_scale = hp->grad_scale,
        .decay = hp->adam_w_mode ? 1.0f - hp->lr * hp->weight_decay : 1.0f,
        .l2 = hp->adam_w_mode ? 0.0f : hp->weight_decay,
    };
    c.has_l2 = c.l2 != 0.0f;
    return c;
}

/* ---- scalar: the reference every SIMD level matches bit for bit -------- */

static inline void store_out_scalar(struct adamw_out out, size_t i, float p)
{
    switch (out.dtype) {
    case DTYPE_F32: ((float *)out.dst)[i] = p; break;
    case DTYPE_F16: ((uint16_t *)out.dst)[i] = f32_to_f16(p); break;
    case DTYPE_BF16: ((uint16_t *)out.dst)[i] = f32_to_bf16(p); break;
    }
}

/* (Plain stores: the scalar code ignores stream.) */
static void adamw_scalar(float *restrict param, float *restrict m, float *restrict v, const float *restrict grad,
                         size_t n, const struct adamw_coeffs *c, struct adamw_out out, struct adamw_streaming stream)
{
    for (size_t i = 0; i < n; i++) {
        const float p = param[i];
        float g = grad[i] * c->grad_scale;
        if (c->has_l2)
            g = fmaf(c->l2, p, g);
        const float mi = fmaf(c->one_minus_beta1, g, c->beta1 * m[i]);
        const float vi = fmaf(c->one_minus_beta2, g * g, c->beta2 * v[i]);
        const float denom = fmaf(sqrtf(vi), c->inv_sqrt_bc2, c->eps);
        const float pn = fmaf(c->neg_step_size, mi / denom, p * c->decay);
        m[i] = mi;
        v[i] = vi;
        param[i] = pn;
        if (out.dst)
            store_out_scalar(out, i, pn);
    }
}

#if ADAMW_X86

/* One cache line of each input, `at` elements in (within the arrays). */
static inline void prefetch_ahead(const float *param, const float *m, const float *v, const float *grad, size_t at)
{
    _mm_prefetch((const char *)(param + at), _MM_HINT_T0);
    _mm_prefetch((const char *)(m + at), _MM_HINT_T0);
    _mm_prefetch((const char *)(v + at), _MM_HINT_T0);
    _mm_prefetch((const char *)(grad + at), _MM_HINT_T0);
}

/* ---- AVX2 + FMA + F16C: 2 x 8 lanes per iteration ---------------------- */

struct adamw_consts_avx2 {
    __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bc2, grad_scale, decay, l2;
};

/* One 8-lane step: updates m, v in registers, returns the new p. */
TARGET_AVX2 static inline __m256 adamw_step_avx2(__m256 p, __m256 g, __m256 *m, __m256 *v,
                                                 const struct adamw_consts_avx2 *k, int has_l2)
{
    g = _mm256_mul_ps(g, k->grad_scale);
    if (has_l2)
        g = _mm256_fmadd_ps(k->l2, p, g);
    *m = _mm256_fmadd_ps(k->one_minus_beta1, g, _mm256_mul_ps(k->beta1, *m));
    *v = _mm256_fmadd_ps(k->one_minus_beta2, _mm256_mul_ps(g, g), _mm256_mul_ps(k->beta2, *v));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(*v), k->inv_sqrt_bc2, k->eps);
    return _mm256_fmadd_ps(k->neg_step_size, _mm256_div_ps(*m, denom), _mm256_mul_ps(p, k->decay));
}

TARGET_AVX2 static inline void store_f32_avx2(float *dst, __m256 x, int stream)
{
    if (stream)
        _mm256_stream_ps(dst, x);
    else
        _mm256_storeu_ps(dst, x);
}

TARGET_AVX2 static void adamw_avx2(float *restrict param, float *restrict m, float *restrict v,
                                   const float *restrict grad, size_t n, const struct adamw_coeffs *c,
                                   struct adamw_out out, struct adamw_streaming stream)
{
    const struct adamw_consts_avx2 k = {
        _mm256_set1_ps(c->beta1), _mm256_set1_ps(c->one_minus_beta1), _mm256_set1_ps(c->beta2),
        _mm256_set1_ps(c->one_minus_beta2), _mm256_set1_ps(c->eps), _mm256_set1_ps(c->neg_step_size),
        _mm256_set1_ps(c->inv_sqrt_bc2), _mm256_set1_ps(c->grad_scale), _mm256_set1_ps(c->decay),
        _mm256_set1_ps(c->l2),
    };
    size_t i = 0;
    for (; i + ADAMW_VEC <= n; i += ADAMW_VEC) {
        if (i + ADAMW_PREFETCH_AHEAD < n)
            prefetch_ahead(param, m, v, grad, i + ADAMW_PREFETCH_AHEAD);
        __m256 m0 = _mm256_loadu_ps(m + i), m1 = _mm256_loadu_ps(m + i + 8);
        __m256 v0 = _mm256_loadu_ps(v + i), v1 = _mm256_loadu_ps(v + i + 8);
        const __m256 p0 = adamw_step_avx2(_mm256_loadu_ps(param + i), _mm256_loadu_ps(grad + i), &m0, &v0, &k, c->has_l2);
        const __m256 p1 = adamw_step_avx2(_mm256_loadu_ps(param + i + 8), _mm256_loadu_ps(grad + i + 8), &m1, &v1, &k,
                                          c->has_l2);
        store_f32_avx2(m + i, m0, stream.state);
        store_f32_avx2(m + i + 8, m1, stream.state);
        store_f32_avx2(v + i, v0, stream.state);
        store_f32_avx2(v + i + 8, v1, stream.state);
        store_f32_avx2(param + i, p0, stream.state);
        store_f32_avx2(param + i + 8, p1, stream.state);
        if (!out.dst)
            continue;
        if (out.dtype == DTYPE_F32) {
            store_f32_avx2((float *)out.dst + i, p0, stream.out);
            store_f32_avx2((float *)out.dst + i + 8, p1, stream.out);
            continue;
        }
        __m256i half16; /* 16 results of 16 bits */
        if (out.dtype == DTYPE_F16) {
            half16 = _mm256_set_m128i(_mm256_cvtps_ph(p1, _MM_FROUND_TO_NEAREST_INT),
                                      _mm256_cvtps_ph(p0, _MM_FROUND_TO_NEAREST_INT));
        } else {
            /* packus interleaves 128-bit lanes (p0 0-3, p1 0-3, p0 4-7, p1 4-7); the permute restores order */
            half16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_round_avx2(p0), bf16_round_avx2(p1)), 0xd8);
        }
        __m256i *dst = (__m256i *)((uint16_t *)out.dst + i);
        if (stream.out)
            _mm256_stream_si256(dst, half16);
        else
            _mm256_storeu_si256(dst, half16);
    }
    if (stream.state || stream.out)
        _mm_sfence(); /* streaming stores are weakly ordered: publish them before the caller's barrier */
    struct adamw_out tail_out = out;
    if (out.dst)
        tail_out.dst = (char *)out.dst + i * (size_t)dtype_size(out.dtype);
    adamw_scalar(param + i, m + i, v + i, grad + i, n - i, c, tail_out, stream);
}

/* ---- AVX-512F: 16 lanes per iteration ---------------------------------- */

TARGET_AVX512 static inline void store_f32_avx512(float *dst, __m512 x, int stream)
{
    if (stream)
        _mm512_stream_ps(dst, x);
    else
        _mm512_storeu_ps(dst, x);
}

TARGET_AVX512 static void adamw_avx512(float *restrict param, float *restrict m, float *restrict v,
                                       const float *restrict grad, size_t n, const struct adamw_coeffs *c,
                                       struct adamw_out out, struct adamw_streaming stream)
{
    const __m512 beta1 = _mm512_set1_ps(c->beta1), one_minus_beta1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 beta2 = _mm512_set1_ps(c->beta2), one_minus_beta2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 eps = _mm512_set1_ps(c->eps), neg_step_size = _mm512_set1_ps(c->neg_step_size);
    const __m512 inv_sqrt_bc2 = _mm512_set1_ps(c->inv_sqrt_bc2), grad_scale = _mm512_set1_ps(c->grad_scale);
    const __m512 decay = _mm512_set1_ps(c->decay), l2 = _mm512_set1_ps(c->l2);
    size_t i = 0;
    for (; i + ADAMW_VEC <= n; i += ADAMW_VEC) {
        if (i + ADAMW_PREFETCH_AHEAD < n)
            prefetch_ahead(param, m, v, grad, i + ADAMW_PREFETCH_AHEAD);
        const __m512 p = _mm512_loadu_ps(param + i);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), grad_scale);
        if (c->has_l2)
            g = _mm512_fmadd_ps(l2, p, g);
        const __m512 mi = _mm512_fmadd_ps(one_minus_beta1, g, _mm512_mul_ps(beta1, _mm512_loadu_ps(m + i)));
        const __m512 vi = _mm512_fmadd_ps(one_minus_beta2, _mm512_mul_ps(g, g), _mm512_mul_ps(beta2, _mm512_loadu_ps(v + i)));
        const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_sqrt_bc2, eps);
        const __m512 pn = _mm512_fmadd_ps(neg_step_size, _mm512_div_ps(mi, denom), _mm512_mul_ps(p, decay));
        store_f32_avx512(m + i, mi, stream.state);
        store_f32_avx512(v + i, vi, stream.state);
        store_f32_avx512(param + i, pn, stream.state);
        if (!out.dst)
            continue;
        if (out.dtype == DTYPE_F32) {
            store_f32_avx512((float *)out.dst + i, pn, stream.out);
            continue;
        }
        const __m256i half16 = out.dtype == DTYPE_F16 ? _mm512_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT)
                                                      : bf16_round_avx512(pn);
        __m256i *dst = (__m256i *)((uint16_t *)out.dst + i);
        if (stream.out)
            _mm256_stream_si256(dst, half16);
        else
            _mm256_storeu_si256(dst, half16);
    }
    if (stream.state || stream.out)
        _mm_sfence(); /* streaming stores are weakly ordered: publish them before the caller's barrier */
    struct adamw_out tail_out = out;
    if (out.dst)
        tail_out.dst = (char *)out.dst + i * (size_t)dtype_size(out.dtype);
    adamw_scalar(param + i, m + i, v + i, grad + i, n - i, c, tail_out, stream);
}
#endif /* ADAMW_X86 */

/* ---- driver ------------------------------------------------------------ */

static adamw_kernel_fn pick_kernel(enum dtype_simd level)
{
    while (level > DTYPE_SIMD_SCALAR && !dtype_simd_available(level))
        level = (enum dtype_simd)(level - 1);
#if ADAMW_X86
    if (level == DTYPE_SIMD_AVX512)
        return adamw_avx512;
    if (level == DTYPE_SIMD_AVX2)
        return adamw_avx2;
#endif
    return adamw_scalar;
}

static int aligned64(const void *p) { return ((uintptr_t)p & 63) == 0; }

/* The first index >= i at which param + index is 64-byte aligned (at most n). */
static size_t align_index(const float *param, size_t i, size_t n)
{
    const size_t skip = ((64 - ((uintptr_t)(param + i) & 63)) & 63) / sizeof(float);
    return i + skip < n ? i + skip : n;
}

/* Elements [lo, hi): a scalar head up to param's 64-byte boundary, then the
 * SIMD kernel, with streaming stores where asked and the arrays are aligned
 * for them (m and v need the same offset from a 64-byte boundary as param). */
static void update_range(adamw_kernel_fn kernel, float *param, float *m, float *v, const float *grad, size_t lo,
                         size_t hi, const struct adamw_coeffs *c, struct adamw_out out, struct adamw_streaming stream)
{
    const struct adamw_streaming none = {0, 0};
    const size_t out_size = out.dst ? (size_t)dtype_size(out.dtype) : 0;
    const size_t body = align_index(param, lo, hi);
    struct adamw_out head_out = out;
    if (out.dst)
        head_out.dst = (char *)out.dst + lo * out_size;
    adamw_scalar(param + lo, m + lo, v + lo, grad + lo, body - lo, c, head_out, none);
    if (body == hi)
        return;
    struct adamw_out body_out = out;
    if (out.dst)
        body_out.dst = (char *)out.dst + body * out_size;
    /* 16 elements of a 16-bit out are 32 bytes: a 32-byte boundary suffices */
    stream.state = stream.state && aligned64(m + body) && aligned64(v + body);
    stream.out = stream.out && out.dst && ((uintptr_t)body_out.dst & (out_size == 4 ? 63 : 31)) == 0;
    kernel(param + body, m + body, v + body, grad + body, hi - body, c, body_out, stream);
}

void adamw_update_with(float *param, float *m, float *v, const float *grad, size_t n, const struct adamw_hparams *hp,
                       void *param_out, enum dtype out_dtype, enum dtype_simd level, enum adamw_stores stores)
{
    const struct adamw_coeffs c = adamw_make_coeffs(hp);
    const struct adamw_out out = {param_out, out_dtype};
    const adamw_kernel_fn kernel = pick_kernel(level);
    if (stores == ADAMW_STORES_AUTO)
        stores = n >= ADAMW_STREAM_MIN ? ADAMW_STORES_STREAM_OUT : ADAMW_STORES_CACHED;
    const struct adamw_streaming stream = {
        .state = stores == ADAMW_STORES_STREAMING,
        .out = stores == ADAMW_STORES_STREAMING || stores == ADAMW_STORES_STREAM_OUT,
    };
    if (n < ADAMW_PARALLEL_MIN) {
        update_range(kernel, param, m, v, grad, 0, n, &c, out, stream);
        return;
    }
#pragma omp parallel
    {
        /* Equal shares, each starting on a 64-byte boundary of param. */
        const size_t threads = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        const size_t lo = t == 0 ? 0 : align_index(param, n / threads * t + n % threads * t / threads, n);
        const size_t hi = t + 1 == threads ? n
                                           : align_index(param, n / threads * (t + 1) + n % threads * (t + 1) / threads, n);
        if (lo < hi)
            update_range(kernel, param, m, v, grad, lo, hi, &c, out, stream);
    }
}

void adamw_update(float *param, float *m, float *v, const float *grad, size_t n, const struct adamw_hparams *hp,
                  void *param_out, enum dtype out_dtype)
{
    adamw_update_with(param, m, v, grad, n, hp, param_out, out_dtype, dtype_simd_best(), ADAMW_STORES_AUTO);
}
