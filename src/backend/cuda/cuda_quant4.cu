/*
 * CUDA backend, bitsandbytes' 4-bit dequantization (backend.h backend_dequant4; core/quant4.h): one thread per
 * element, its code's table value times its block's absmax (or the absmax rebuilt from the double quantization),
 * bit for bit the CPU's quant4_dequantize. A rank's share of blocks may start anywhere in a nested block (phase:
 * its first block's place there). __fmul_rn / __fadd_rn keep nvcc from fusing the double quantization's product
 * and sum into one multiply-add (bitsandbytes rounds them apart).
 */
#include "cuda_internal.h"

extern "C" {
#include "core/quant4.h"
}

/* The tables travel as kernel arguments (1 KiB): no constant memory to set up per device. */
struct quant4_code_table {
    float v[16];
};
struct quant4_dynamic_table {
    float v[256];
};

template <typename O>
__global__ static void dequant4_kernel(O *out, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                                       const float *nested_absmax, const float *offset, size_t phase, size_t n,
                                       quant4_code_table table, quant4_dynamic_table dynamic)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t b = i / QUANT4_BLOCK;
        const float scale = qabsmax ? __fadd_rn(__fmul_rn(dynamic.v[qabsmax[b]],
                                                          nested_absmax[(phase + b) / QUANT4_NESTED_BLOCK]),
                                                *offset)
                                    : absmax[b];
        const uint8_t byte = codes[i / 2];
        st(out, i, __fmul_rn(table.v[(i & 1) ? byte & 0x0f : byte >> 4], scale));
    }
}

extern "C" void backend_dequant4(void *out, enum dtype out_dt, const uint8_t *codes, const float *absmax,
                                 const uint8_t *qabsmax, const float *nested_absmax, const float *offset,
                                 size_t first_block, size_t n, int type)
{
    if (!n)
        return;
    quant4_code_table table;
    quant4_dynamic_table dynamic;
    memcpy(table.v, quant4_table((enum quant4_type)type), sizeof table.v);
    memcpy(dynamic.v, quant4_dynamic_map(), sizeof dynamic.v);
    const unsigned grid = blocks_for(n, BLOCK);
    const size_t phase = first_block % QUANT4_NESTED_BLOCK; /* the first block's place in its nested block */
    switch (out_dt) {
    case DTYPE_F16:
        dequant4_kernel<<<grid, BLOCK, 0, g_stream>>>((__half *)out, codes, absmax, qabsmax, nested_absmax, offset,
                                                      phase, n, table, dynamic);
        break;
    case DTYPE_BF16:
        dequant4_kernel<<<grid, BLOCK, 0, g_stream>>>((__nv_bfloat16 *)out, codes, absmax, qabsmax, nested_absmax,
                                                      offset, phase, n, table, dynamic);
        break;
    default:
        dequant4_kernel<<<grid, BLOCK, 0, g_stream>>>((float *)out, codes, absmax, qabsmax, nested_absmax, offset,
                                                      phase, n, table, dynamic);
        break;
    }
    cudaCheck(cudaGetLastError());
}
