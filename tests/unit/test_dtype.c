/*
 * test_dtype — fp32 <-> fp16/bf16 conversions: every fp16 and bf16 bit pattern,
 * hand-picked rounding cases (ties, subnormals, overflow, NaN), and the SIMD
 * levels against the scalar code, bit for bit.
 *
 * SHARDLM_TEST_EXHAUSTIVE=1 also runs all 2^32 fp32 bit patterns through every
 * level (a few seconds with -O3; slow under the sanitizers).
 */
#include "check.h"
#include "core/dtype.h"
#include "core/util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static int bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu); }

/* The value of an fp16 pattern from its definition, in double (finite patterns). */
static double f16_value(uint16_t h)
{
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double mag = exp ? ldexp(1024 + mant, exp - 25) : ldexp(mant, -24);
    return (h & 0x8000) ? -mag : mag;
}

static void test_f16_all_patterns(void)
{
    int bad_value = 0, bad_trip = 0, bad_nan = 0;
    uint32_t first_value = 0, first_trip = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        const float f = f16_to_f32(h);
        const uint16_t back = f32_to_f16(f);
        if (f16_is_nan(h)) {
            /* NaN stays NaN, quiet (bit 22 in fp32, bit 9 in fp16), payload kept */
            const uint32_t u = f32_bits(f);
            if (!isnan(f) || !(u & 0x400000u) || ((u >> 13) & 0x1ffu) != (h & 0x1ffu) || back != (h | 0x200u))
                bad_nan++;
            continue;
        }
        const int exp = (h >> 10) & 0x1f;
        const double want = exp == 0x1f ? ((h & 0x8000) ? -INFINITY : INFINITY) : f16_value(h);
        if ((double)f != want || !!signbit(f) != !!(h & 0x8000)) {
            if (!bad_value++)
                first_value = h;
        }
        if (back != h) {
            if (!bad_trip++)
                first_trip = h;
        }
    }
    CHECK("f16_to_f32 exact on all 63488 non-NaN patterns", bad_value == 0, "%d wrong, first 0x%04x", bad_value,
          first_value);
    CHECK("f16 -> f32 -> f16 round trip on all non-NaN patterns", bad_trip == 0, "%d wrong, first 0x%04x", bad_trip,
          first_trip);
    CHECK("f16 NaN patterns stay NaN, quiet, payload kept", bad_nan == 0, "%d wrong", bad_nan);
}

static void test_bf16_all_patterns(void)
{
    int bad = 0, bad_nan = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t b = (uint16_t)i;
        const float f = bf16_to_f32(b);
        if (bf16_is_nan(b)) {
            bad_nan += !isnan(f) || f32_bits(f) != ((i << 16) | 0x400000u) || f32_to_bf16(f) != (b | 0x40u);
            continue;
        }
        bad += f32_bits(f) != i << 16 || f32_to_bf16(f) != b;
    }
    CHECK("bf16 -> f32 exact and round trip on all non-NaN patterns", bad == 0, "%d wrong", bad);
    CHECK("bf16 NaN patterns stay NaN, quiet", bad_nan == 0, "%d wrong", bad_nan);
}

struct case16 {
    uint32_t in;  /* fp32 bits */
    uint16_t out; /* expected 16-bit pattern */
    const char *what;
};

static const struct case16 f16_cases[] = {
    {0x3f800000, 0x3c00, "1.0"},
    {0x3f801000, 0x3c00, "1 + 2^-11: tie, to even (down)"},
    {0x3f803000, 0x3c02, "1 + 3*2^-11: tie, to even (up)"},
    {0x3f801001, 0x3c01, "just above a tie rounds up"},
    {0x3f800fff, 0x3c00, "just below a tie rounds down"},
    {0xbf803000, 0xbc02, "negative tie"},
    {0x477fe000, 0x7bff, "65504 = fp16 max"},
    {0x477fefff, 0x7bff, "just below 65520 rounds to max"},
    {0x477ff000, 0x7c00, "65520: tie past max -> inf"},
    {0x47800000, 0x7c00, "65536 -> inf"},
    {0x501502f9, 0x7c00, "1e10 -> inf"},
    {0xc77ff000, 0xfc00, "-65520 -> -inf"},
    {0x38800000, 0x0400, "2^-14, smallest normal"},
    {0x387fe000, 0x0400, "1023.5 * 2^-24: tie, to even = smallest normal"},
    {0x387fc000, 0x03ff, "largest subnormal"},
    {0x33800000, 0x0001, "2^-24, smallest subnormal"},
    {0x33000000, 0x0000, "2^-25: tie, to even (zero)"},
    {0x33000001, 0x0001, "just above 2^-25"},
    {0x33c00000, 0x0002, "3*2^-25: tie, to even (2)"},
    {0x34200000, 0x0002, "5*2^-25: tie, to even (2)"},
    {0x34600000, 0x0004, "7*2^-25: tie, to even (4)"},
    {0xb3c00000, 0x8002, "-3*2^-25"},
    {0x32ffffff, 0x0000, "below 2^-25 -> 0"},
    {0x00000001, 0x0000, "fp32 subnormal -> 0"},
    {0x80000001, 0x8000, "negative fp32 subnormal -> -0"},
    {0x80000000, 0x8000, "-0"},
    {0x7f800000, 0x7c00, "inf"},
    {0xff800000, 0xfc00, "-inf"},
    {0x7fc00000, 0x7e00, "quiet NaN"},
    {0x7f800001, 0x7e00, "signalling NaN made quiet"},
    {0x7fa00000, 0x7f00, "signalling NaN, payload kept"},
    {0xffc00001, 0xfe00, "negative NaN"},
};

static const struct case16 bf16_cases[] = {
    {0x3f800000, 0x3f80, "1.0"},
    {0x3f808000, 0x3f80, "tie, to even (down)"},
    {0x3f818000, 0x3f82, "tie, to even (up)"},
    {0x3f808001, 0x3f81, "just above a tie"},
    {0x3f807fff, 0x3f80, "just below a tie"},
    {0x7f7f7fff, 0x7f7f, "largest below max"},
    {0x7f7f8000, 0x7f80, "tie past bf16 max -> inf"},
    {0x7f7fffff, 0x7f80, "FLT_MAX -> inf"},
    {0xff7fffff, 0xff80, "-FLT_MAX -> -inf"},
    {0x00008000, 0x0000, "subnormal tie, to even (zero)"},
    {0x00018000, 0x0002, "subnormal tie, to even (up)"},
    {0x0000ffff, 0x0001, "subnormal rounds up"},
    {0x00000001, 0x0000, "smallest fp32 subnormal"},
    {0x807fffff, 0x8080, "largest negative subnormal -> smallest normal"},
    {0x7f800000, 0x7f80, "inf"},
    {0x7fc00000, 0x7fc0, "quiet NaN"},
    {0x7f800001, 0x7fc0, "signalling NaN made quiet"},
    {0xff810000, 0xffc1, "negative signalling NaN, payload kept"},
    {0x7f80ffff, 0x7fc0, "NaN whose low bits would carry into the exponent"},
};

/* Each hand-picked case through the scalar function and every SIMD level (as
 * one array, so that the vector loop sees them, not only the scalar tail). */
static void test_cases(const struct case16 *cases, size_t n_cases, enum dtype dt)
{
    const char *name = dtype_name(dt);
    char label[160];
    float in[64];
    uint16_t out[64];
    for (size_t i = 0; i < n_cases; i++) {
        const float f = f32_from_bits(cases[i].in);
        const uint16_t got = dt == DTYPE_F16 ? f32_to_f16(f) : f32_to_bf16(f);
        snprintf(label, sizeof label, "f32 -> %s: %s", name, cases[i].what);
        CHECK(label, got == cases[i].out, "0x%08x gave 0x%04x, want 0x%04x", cases[i].in, got, cases[i].out);
        in[i] = f;
    }
    for (int level = DTYPE_SIMD_SCALAR; level <= DTYPE_SIMD_AVX512; level++) {
        if (!dtype_simd_available((enum dtype_simd)level))
            continue;
        memset(out, 0, sizeof out);
        dtype_convert_simd(out, dt, in, DTYPE_F32, n_cases, (enum dtype_simd)level);
        int bad = 0;
        for (size_t i = 0; i < n_cases; i++)
            bad += out[i] != cases[i].out;
        snprintf(label, sizeof label, "f32 -> %s hand-picked cases, %s", name, dtype_simd_name((enum dtype_simd)level));
        CHECK(label, bad == 0, "%d of %zu wrong", bad, n_cases);
    }
}

/* fp32 patterns that exercise rounding: every value of the top 16 bits with
 * low 16 bits at the fp16 and bf16 rounding boundaries, then random bits. */
static size_t fill_rounding_patterns(uint32_t *x, size_t n, uint64_t *rng)
{
    static const uint16_t low[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                                   0x7fff, 0x8000, 0x8001, 0x9000, 0xa000, 0xe000, 0xefff, 0xffff};
    const size_t n_low = sizeof low / sizeof low[0];
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536 && k < n; hi++)
        for (size_t j = 0; j < n_low && k < n; j++)
            x[k++] = hi << 16 | low[j];
    while (k < n)
        x[k++] = (uint32_t)splitmix64(rng);
    return k;
}

#ifdef __FLT16_MAX__
/* The compiler's own float -> _Float16 conversion (libgcc or AVX512-FP16) as an
 * independent reference for f32_to_f16. */
static void test_against_float16(const uint32_t *x, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const float f = f32_from_bits(x[i]);
        if (isnan(f))
            continue;
        _Float16 ref = (_Float16)f;
        uint16_t ref_bits;
        memcpy(&ref_bits, &ref, sizeof ref_bits);
        if (f32_to_f16(f) != ref_bits && !bad++)
            first = i;
    }
    CHECK("f32_to_f16 equals the compiler's _Float16 conversion (1M patterns)", bad == 0,
          "%zu differ, first 0x%08x", bad, n ? x[first] : 0);
}
#endif

/* Every conversion pair, every available level, equal to the scalar level bit
 * for bit; src and dst offset by one element so that nothing is aligned. */
static void test_levels_match(const void *src_by_dt[3], size_t n, const char *what)
{
    char label[160];
    unsigned char *want = malloc(4 * (n + 1)), *got = malloc(4 * (n + 1));
    for (int s = DTYPE_F32; s <= DTYPE_BF16; s++) {
        for (int d = DTYPE_F32; d <= DTYPE_BF16; d++) {
            const size_t dsz = (size_t)dtype_size((enum dtype)d);
            const char *src = (const char *)src_by_dt[s] + dtype_size((enum dtype)s);
            dtype_convert_simd(want + dsz, (enum dtype)d, src, (enum dtype)s, n - 1, DTYPE_SIMD_SCALAR);
            for (int level = DTYPE_SIMD_AVX2; level <= DTYPE_SIMD_AVX512; level++) {
                if (!dtype_simd_available((enum dtype_simd)level))
                    continue;
                memset(got, 0xa5, 4 * (n + 1));
                dtype_convert_simd(got + dsz, (enum dtype)d, src, (enum dtype)s, n - 1, (enum dtype_simd)level);
                snprintf(label, sizeof label, "%s: %s -> %s, %s == scalar", what, dtype_name((enum dtype)s),
                         dtype_name((enum dtype)d), dtype_simd_name((enum dtype_simd)level));
                size_t first = 0, bad = 0;
                for (size_t i = 0; i < (n - 1) * dsz; i++)
                    if (got[dsz + i] != want[dsz + i] && !bad++)
                        first = i / dsz;
                CHECK(label, bad == 0, "%zu bytes differ, first at element %zu", bad, first);
            }
        }
    }
    /* the default entry point is the best level, same bits */
    dtype_convert(got, DTYPE_BF16, src_by_dt[DTYPE_F32], DTYPE_F32, n);
    dtype_convert_simd(want, DTYPE_BF16, src_by_dt[DTYPE_F32], DTYPE_F32, n, DTYPE_SIMD_SCALAR);
    snprintf(label, sizeof label, "%s: dtype_convert (best level) == scalar", what);
    CHECK(label, memcmp(got, want, 2 * n) == 0, "differs");
    free(want);
    free(got);
}

static void test_add_to_f32(const void *src_by_dt[3], size_t n)
{
    char label[160];
    float *acc0 = malloc(n * sizeof *acc0), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    uint64_t rng = 7;
    for (size_t i = 0; i < n; i++)
        acc0[i] = rng_normal(&rng);
    for (int dt = DTYPE_F32; dt <= DTYPE_BF16; dt++) {
        const void *src = src_by_dt[dt];
        for (size_t i = 0; i < n; i++) {
            const float x = dt == DTYPE_F32   ? ((const float *)src)[i]
                          : dt == DTYPE_F16   ? f16_to_f32(((const uint16_t *)src)[i])
                                              : bf16_to_f32(((const uint16_t *)src)[i]);
            want[i] = acc0[i] + x;
        }
        for (int level = DTYPE_SIMD_SCALAR; level <= DTYPE_SIMD_AVX512; level++) {
            if (!dtype_simd_available((enum dtype_simd)level))
                continue;
            memcpy(got, acc0, n * sizeof *got);
            dtype_add_to_f32_simd(got, src, (enum dtype)dt, n, (enum dtype_simd)level);
            snprintf(label, sizeof label, "add_to_f32 %s, %s", dtype_name((enum dtype)dt),
                     dtype_simd_name((enum dtype_simd)level));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += f32_bits(got[i]) != f32_bits(want[i]) && !(isnan(got[i]) && isnan(want[i]));
            CHECK(label, bad == 0, "%zu elements differ", bad);
        }
    }
    free(acc0);
    free(want);
    free(got);
}

static void test_all_finite(void)
{
    const size_t sizes[] = {1, 15, 1000, 200003}; /* the last runs in parallel */
    const uint32_t bad32[] = {0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001};
    const uint16_t bad16[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01};
    const uint16_t badbf[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81};
    char label[160];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        float *f = malloc(n * sizeof *f);
        uint16_t *h = malloc(n * sizeof *h), *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) {
            /* large but finite values, the largest of each dtype included */
            f[i] = i % 3 ? 3.0e38f : -1e-40f;
            h[i] = i % 2 ? 0x7bff : 0xfbff;
            b[i] = i % 2 ? 0x7f7f : 0x0001;
        }
        snprintf(label, sizeof label, "all_finite n=%zu: finite arrays pass", n);
        CHECK(label, dtype_all_finite(f, DTYPE_F32, n) && dtype_all_finite(h, DTYPE_F16, n) &&
                         dtype_all_finite(b, DTYPE_BF16, n), "reported a non-finite value");
        int missed = 0;
        for (int k = 0; k < 4; k++) {
            const size_t at = k == 0 ? 0 : k == 1 ? n - 1 : k == 2 ? n / 2 : n / 3;
            memcpy(&f[at], &bad32[k], 4);
            h[at] = bad16[k];
            b[at] = badbf[k];
            missed += dtype_all_finite(f, DTYPE_F32, n) + dtype_all_finite(h, DTYPE_F16, n) +
                      dtype_all_finite(b, DTYPE_BF16, n);
            f[at] = 1.0f;
            h[at] = 0x3c00;
            b[at] = 0x3f80;
        }
        snprintf(label, sizeof label, "all_finite n=%zu: inf/NaN at start, end, middle found", n);
        CHECK(label, missed == 0, "%d missed", missed);
        free(f);
        free(h);
        free(b);
    }
    CHECK("all_finite n=0 is true", dtype_all_finite(NULL, DTYPE_F16, 0), "false");
}

/* All 2^32 fp32 patterns: every level equals the scalar code. */
static void test_exhaustive_f32(void)
{
    const size_t chunk = (size_t)1 << 24;
    float *src = malloc(chunk * sizeof *src);
    uint16_t *want = malloc(chunk * 2), *got = malloc(chunk * 2);
    size_t bad[2] = {0, 0};
    for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
        for (size_t i = 0; i < chunk; i++) {
            const uint32_t u = (uint32_t)(base + i);
            memcpy(&src[i], &u, 4);
        }
        for (int d = 0; d < 2; d++) {
            const enum dtype dt = d ? DTYPE_BF16 : DTYPE_F16;
            dtype_convert_simd(want, dt, src, DTYPE_F32, chunk, DTYPE_SIMD_SCALAR);
            for (int level = DTYPE_SIMD_AVX2; level <= DTYPE_SIMD_AVX512; level++) {
                if (!dtype_simd_available((enum dtype_simd)level))
                    continue;
                dtype_convert_simd(got, dt, src, DTYPE_F32, chunk, (enum dtype_simd)level);
                bad[d] += memcmp(got, want, chunk * 2) != 0;
            }
        }
    }
    CHECK("exhaustive: all 2^32 fp32 patterns -> fp16, every level == scalar", bad[0] == 0, "%zu chunks differ",
          bad[0]);
    CHECK("exhaustive: all 2^32 fp32 patterns -> bf16, every level == scalar", bad[1] == 0, "%zu chunks differ",
          bad[1]);
    free(src);
    free(want);
    free(got);
}

int main(void)
{
    printf("# SIMD level: %s\n", dtype_simd_name(dtype_simd_best()));
    test_f16_all_patterns();
    test_bf16_all_patterns();
    test_cases(f16_cases, sizeof f16_cases / sizeof f16_cases[0], DTYPE_F16);
    test_cases(bf16_cases, sizeof bf16_cases / sizeof bf16_cases[0], DTYPE_BF16);

    /* Large arrays: rounding-boundary and random fp32 patterns (NaN, inf,
     * subnormals included), all 65536 16-bit patterns repeated, and random
     * normal values. An odd length leaves a scalar tail. */
    const size_t n = 1200007;
    uint64_t rng = 12345;
    uint32_t *bits32 = malloc((n + 1) * sizeof *bits32);
    uint16_t *bits16 = malloc((n + 1) * sizeof *bits16);
    float *normal = malloc((n + 1) * sizeof *normal);
    uint16_t *normal_f16 = malloc((n + 1) * sizeof *normal_f16), *normal_bf16 = malloc((n + 1) * sizeof *normal_bf16);
    fill_rounding_patterns(bits32, n + 1, &rng);
    for (size_t i = 0; i <= n; i++) {
        bits16[i] = (uint16_t)(i * 40503u); /* odd multiplier: every pattern within 65536 */
        normal[i] = rng_normal(&rng) * ldexpf(1.0f, (int)(splitmix64(&rng) % 40) - 20);
        normal_f16[i] = f32_to_f16(normal[i]);
        normal_bf16[i] = f32_to_bf16(normal[i]);
    }
#ifdef __FLT16_MAX__
    test_against_float16(bits32, n);
#endif
    const void *patterns[3] = {bits32, bits16, bits16};
    test_levels_match(patterns, n, "bit patterns");
    const void *values[3] = {normal, normal_f16, normal_bf16};
    test_levels_match(values, n, "random values");
    test_add_to_f32(values, n);
    test_add_to_f32(patterns, n);

    /* bf16 rounding error bound on normal values: at most half an ulp, u = 2^-8 */
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double rel = fabs((double)bf16_to_f32(normal_bf16[i]) - normal[i]) / fabs(normal[i]);
        worst = rel > worst ? rel : worst;
    }
    CHECK("f32 -> bf16 error <= 2^-8 relative on random values", worst <= ldexp(1, -8), "worst %g", worst);

    test_all_finite();
    const char *exhaustive = getenv("SHARDLM_TEST_EXHAUSTIVE");
    if (exhaustive && strcmp(exhaustive, "1") == 0)
        test_exhaustive_f32();
    free(bits32);
    free(bits16);
    free(normal);
    free(normal_f16);
    free(normal_bf16);
    return check_status();
}
