/*
 * quant4 — NF4/FP4 blockwise quantization and its double quantization, as
 * bitsandbytes 0.50 computes them on the CPU (contract in quant4.h).
 *
 * Where each rule comes from (bitsandbytes 0.50.2):
 *   4-bit quantize:  backends/default/ops.py quantize_4bit (torch ops; the CPU
 *                    backend registers no kernel of its own): reciprocal then
 *                    multiply for whole blocks, a true division for the short
 *                    last block, clamp, torch.bucketize on the fp32 midpoints
 *                    of the sorted table, FP4 remapped through argsort's order.
 *   4-bit dequantize: csrc/cpu_ops.cpp dequantizeBlockwise4bitCpu: table value
 *                    times absmax in fp32, then one rounding to the output.
 *   nested:          functional.py quantize_4bit: offset = absmax.mean(),
 *                    quantize_blockwise(absmax - offset, blocksize=256), whose
 *                    CPU kernel (csrc/cpu_ops.cpp quantize_cpu_impl) maps
 *                    x * (1 / block absmax) onto a 65536-entry table of nearest
 *                    codes through fma((v + 1) * 0.5, 65535, 0.5), truncated.
 * This file is compiled with -ffp-contract=off (Makefile): the nested
 * dequantization's product and sum are two roundings in bitsandbytes, and a
 * fused multiply-add here would change the last bit.
 */
#include "core/quant4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* bitsandbytes' NF4 table (functional.get_4bit_type("nf4")), code order = value order. */
static const float nf4_table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* FP4 (1 sign, 2 exponent, 1 mantissa bit, bias 2) divided by its largest
 * magnitude 12 in fp32: get_4bit_type("fp4"). Code 8 dequantizes to -0, as
 * bitsandbytes' CPU kernel (fp4_lut) does for every tensor whose last
 * dimension is even; its torch fallback for an odd last dimension writes +0
 * (the same value; only the sign bit differs). */
static const float fp4_table[16] = {
    0.0f, 0.0625f / 12.0f, 8.0f / 12.0f, 1.0f, 4.0f / 12.0f, 6.0f / 12.0f, 2.0f / 12.0f, 3.0f / 12.0f,
    -0.0f, -0.0625f / 12.0f, -8.0f / 12.0f, -1.0f, -4.0f / 12.0f, -6.0f / 12.0f, -2.0f / 12.0f, -3.0f / 12.0f,
};

/* The codes in increasing value, as torch.argsort ordered bitsandbytes' FP4
 * table (backends/default/ops.py _get_4bit_quantize_bounds): of the two
 * zeros, code 0 comes first. tests/t_quant4.py checks it against bitsandbytes. */
static const uint8_t fp4_sorted_codes[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
static const uint8_t nf4_sorted_codes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), sorted. */
static const float dynamic_map[256] = {
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0p+0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f,
};

/* torch.clamp(min=1e-38) on the absmax before the reciprocal (an all-zero block). */
#define QUANT4_ABSMAX_FLOOR 1e-38f
/* quantize_cpu_impl's table of nearest codes: 65536 bins over [-1, 1]. */
#define NESTED_LUT_SIZE 65536

int quant4_type_parse(const char *name)
{
    if (strcmp(name, "nf4") == 0)
        return QUANT4_NF4;
    if (strcmp(name, "fp4") == 0)
        return QUANT4_FP4;
    return -1;
}

const char *quant4_type_name(enum quant4_type type) { return type == QUANT4_FP4 ? "fp4" : "nf4"; }

const float *quant4_table(enum quant4_type type) { return type == QUANT4_FP4 ? fp4_table : nf4_table; }

const float *quant4_dynamic_map(void) { return dynamic_map; }

static float load_f32(const void *src, enum dtype dt, size_t i)
{
    switch (dt) {
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)src)[i]);
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

static void store_f32(void *dst, enum dtype dt, size_t i, float v)
{
    switch (dt) {
    case DTYPE_F16: ((uint16_t *)dst)[i] = f32_to_f16(v); break;
    case DTYPE_BF16: ((uint16_t *)dst)[i] = f32_to_bf16(v); break;
    default: ((float *)dst)[i] = v; break;
    }
}

/* torch.clamp(x, -1, 1): NaN stays NaN. */
static inline float clamp_unit(float x) { return x < -1.0f ? -1.0f : (x > 1.0f ? 1.0f : x); }

/* The code of a scaled value: torch.bucketize(x, midpoints) (the number of
 * midpoints strictly below x) mapped through the sorted order. */
static inline uint8_t nearest_code(float x, const float *midpoints, const uint8_t *sorted_codes)
{
    int idx = 0;
    while (idx < 15 && midpoints[idx] < x)
        idx++;
    return sorted_codes[idx];
}

void quant4_quantize(enum quant4_type type, const void *src, enum dtype dt, size_t n, uint8_t *codes, float *absmax)
{
    const float *table = quant4_table(type);
    const uint8_t *sorted_codes = type == QUANT4_FP4 ? fp4_sorted_codes : nf4_sorted_codes;
    float midpoints[15];
    for (int i = 0; i < 15; i++)
        midpoints[i] = (table[sorted_codes[i]] + table[sorted_codes[i + 1]]) / 2.0f;
    const uint8_t zero_code = nearest_code(0.0f, midpoints, sorted_codes);
    const size_t n_blocks = quant4_blocks(n);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t start = b * QUANT4_BLOCK;
        const size_t len = n - start < QUANT4_BLOCK ? n - start : QUANT4_BLOCK;
        float block[QUANT4_BLOCK];
        float amax = 0.0f;
        for (size_t i = 0; i < len; i++) {
            block[i] = load_f32(src, dt, start + i);
            amax = fabsf(block[i]) > amax || isnan(block[i]) ? fabsf(block[i]) : amax;
        }
        absmax[b] = amax;
        const float floor_amax = amax > QUANT4_ABSMAX_FLOOR ? amax : QUANT4_ABSMAX_FLOOR;
        uint8_t q[QUANT4_BLOCK + 1];
        if (len == QUANT4_BLOCK) {
            const float inv = 1.0f / floor_amax;
            for (size_t i = 0; i < len; i++)
                q[i] = nearest_code(clamp_unit(block[i] * inv), midpoints, sorted_codes);
        } else {
            for (size_t i = 0; i < len; i++)
                q[i] = nearest_code(clamp_unit(block[i] / floor_amax), midpoints, sorted_codes);
        }
        q[len] = zero_code; /* the pad nibble of an odd tensor */
        for (size_t i = 0; i < len; i += 2)
            codes[(start + i) / 2] = (uint8_t)(q[i] << 4 | q[i + 1]);
    }
}

void quant4_dequantize(enum quant4_type type, const uint8_t *codes, const float *absmax, size_t n, void *dst,
                       enum dtype dt)
{
    const float *table = quant4_table(type);
    const size_t n_blocks = quant4_blocks(n);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t start = b * QUANT4_BLOCK;
        const size_t end = n - start < QUANT4_BLOCK ? n : start + QUANT4_BLOCK;
        const float scale = absmax[b];
        /* the block's 16 values, table[code] * scale in fp32 as bitsandbytes multiplies them, each converted
         * once: then a byte of codes is two lookups (a block starts on a byte, its codes high nibble first) */
        float lut[16];
        uint16_t lut16[16];
        for (int c = 0; c < 16; c++) {
            lut[c] = table[c] * scale;
            lut16[c] = dt == DTYPE_F16 ? f32_to_f16(lut[c]) : dt == DTYPE_BF16 ? f32_to_bf16(lut[c]) : 0;
        }
        const uint8_t *in = codes + start / 2;
        const size_t pairs = (end - start) / 2;
        if (dt == DTYPE_F16 || dt == DTYPE_BF16) {
            uint16_t *o = (uint16_t *)dst + start;
            for (size_t k = 0; k < pairs; k++) {
                o[2 * k] = lut16[in[k] >> 4];
                o[2 * k + 1] = lut16[in[k] & 0x0f];
            }
        } else {
            float *o = (float *)dst + start;
            for (size_t k = 0; k < pairs; k++) {
                o[2 * k] = lut[in[k] >> 4];
                o[2 * k + 1] = lut[in[k] & 0x0f];
            }
        }
        if ((end - start) % 2) /* an odd tensor's last element: the high nibble of its last byte */
            store_f32(dst, dt, end - 1, lut[in[pairs] >> 4]);
    }
}

/* aten/src/ATen/native/cpu/SumKernel.cpp, for one contiguous fp32 vector:
 * the constants of its cascade (ilp_factor, num_levels) and the vector width
 * of its AVX2 kernels (Vectorized<float>: 8 lanes). */
#define TORCH_SUM_ILP 4
#define TORCH_SUM_LEVELS 4
#define TORCH_SUM_LANES 8

static int64_t ceil_log2(int64_t x) { return x <= 2 ? 1 : 64 - __builtin_clzll((unsigned long long)(x - 1)); }

/* multi_row_sum: rows of TORCH_SUM_ILP vectors of `lanes` floats, summed in
 * levels so that no accumulator takes more than 2^level_power rows. */
static void multi_row_sum(const float *data, int64_t rows, int lanes, float out[TORCH_SUM_ILP][TORCH_SUM_LANES])
{
    int64_t level_power = ceil_log2(rows) / TORCH_SUM_LEVELS;
    if (level_power < 4)
        level_power = 4;
    const int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;
    float acc[TORCH_SUM_LEVELS][TORCH_SUM_ILP][TORCH_SUM_LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + level_step <= rows) {
        for (int64_t j = 0; j < level_step; j++, i++)
            for (int k = 0; k < TORCH_SUM_ILP; k++)
                for (int l = 0; l < lanes; l++)
                    acc[0][k][l] += data[(i * TORCH_SUM_ILP + k) * lanes + l];
        for (int j = 1; j < TORCH_SUM_LEVELS; j++) {
            for (int k = 0; k < TORCH_SUM_ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (level_mask << (j * level_power))) != 0)
                break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < TORCH_SUM_ILP; k++)
            for (int l = 0; l < lanes; l++)
                acc[0][k][l] += data[(i * TORCH_SUM_ILP + k) * lanes + l];
    for (int j = 1; j < TORCH_SUM_LEVELS; j++)
        for (int k = 0; k < TORCH_SUM_ILP; k++)
            for (int l = 0; l < lanes; l++)
                acc[0][k][l] += acc[j][k][l];
    memcpy(out, acc[0], sizeof acc[0]);
}

/* row_sum: `size` vectors of `lanes` floats; the vectors left over from the
 * rows of TORCH_SUM_ILP go into the first accumulator. */
static void row_sum(const float *data, int64_t size, int lanes, float out[TORCH_SUM_LANES])
{
    float partial[TORCH_SUM_ILP][TORCH_SUM_LANES];
    const int64_t rows = size / TORCH_SUM_ILP;
    multi_row_sum(data, rows, lanes, partial);
    for (int64_t i = rows * TORCH_SUM_ILP; i < size; i++)
        for (int l = 0; l < lanes; l++)
            partial[0][l] += data[i * lanes + l];
    for (int k = 1; k < TORCH_SUM_ILP; k++)
        for (int l = 0; l < lanes; l++)
            partial[0][l] += partial[k][l];
    memcpy(out, partial[0], sizeof partial[0]);
}

float quant4_nested_offset(const float *absmax, size_t n_absmax)
{
    const int64_t n = (int64_t)n_absmax;
    float lanes_sum[TORCH_SUM_LANES];
    float sum = 0.0f;
    if (n >= TORCH_SUM_LANES) { /* vectorized_inner_sum */
        const int64_t vectors = n / TORCH_SUM_LANES;
        row_sum(absmax, vectors, TORCH_SUM_LANES, lanes_sum);
        for (int64_t k = vectors * TORCH_SUM_LANES; k < n; k++)
            sum += absmax[k];
        for (int l = 0; l < TORCH_SUM_LANES; l++)
            sum += lanes_sum[l];
    } else { /* scalar_inner_sum */
        row_sum(absmax, n, 1, lanes_sum);
        sum = lanes_sum[0];
    }
    return sum / (float)n;
}

/* build_quantize_lut: for each of the 65536 bins of [-1, 1], the nearest
 * entry of the dynamic map, a bin on a midpoint going to the lower entry. */
static void nested_lut(uint8_t *lut)
{
    float midpoints[255];
    for (int i = 0; i < 255; i++)
        midpoints[i] = 0.5f * (dynamic_map[i] + dynamic_map[i + 1]);
    int code = 0;
    for (int i = 0; i < NESTED_LUT_SIZE; i++) {
        const float val = -1.0f + (2.0f * (float)i) / (float)(NESTED_LUT_SIZE - 1);
        while (code < 255 && midpoints[code] < val)
            code++;
        lut[i] = (uint8_t)code;
    }
}

void quant4_nested_quantize(const float *absmax, size_t n_absmax, float offset, uint8_t *qabsmax,
                            float *nested_absmax)
{
    uint8_t *lut = xmalloc(NESTED_LUT_SIZE);
    nested_lut(lut);
    const size_t n_blocks = quant4_nested_blocks(n_absmax);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t start = b * QUANT4_NESTED_BLOCK;
        const size_t end = n_absmax - start < QUANT4_NESTED_BLOCK ? n_absmax : start + QUANT4_NESTED_BLOCK;
        float amax = 0.0f;
        for (size_t i = start; i < end; i++) {
            const float v = fabsf(absmax[i] - offset);
            amax = amax < v ? v : amax; /* std::max(amax, v) */
        }
        nested_absmax[b] = amax;
        if (amax == 0.0f) {
            memset(qabsmax + start, 0, end - start);
            continue;
        }
        const float inv = 1.0f / amax;
        for (size_t i = start; i < end; i++) {
            float v = (absmax[i] - offset) * inv;
            v = v < -1.0f ? -1.0f : (1.0f < v ? 1.0f : v); /* std::clamp */
            const int bin = (int)fmaf((v + 1.0f) * 0.5f, (float)(NESTED_LUT_SIZE - 1), 0.5f);
            qabsmax[i] = lut[(uint16_t)bin];
        }
    }
    free(lut);
}

void quant4_nested_dequantize(const uint8_t *qabsmax, const float *nested_absmax, float offset, size_t first_block,
                              size_t n_absmax, float *absmax)
{
    const size_t phase = first_block % QUANT4_NESTED_BLOCK;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n_absmax; i++) {
        const float scaled = dynamic_map[qabsmax[i]] * nested_absmax[(phase + i) / QUANT4_NESTED_BLOCK];
        absmax[i] = scaled + offset;
    }
}

void quant4_dequantize_stored(enum quant4_type type, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                              const float *nested_absmax, float offset, size_t first_block, size_t n, void *dst,
                              enum dtype dt)
{
    float *nested = NULL;
    if (qabsmax) {
        const size_t blocks = quant4_blocks(n);
        nested = xmalloc(blocks * sizeof *nested);
        quant4_nested_dequantize(qabsmax, nested_absmax, offset, first_block, blocks, nested);
        absmax = nested;
    }
    quant4_dequantize(type, codes, absmax, n, dst, dt);
    free(nested);
}
