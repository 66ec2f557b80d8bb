/*
 * CPU backend, row-wise helpers of backend.h: a bias added to every row of a
 * matmul output and its gradient (the column sums), and strided column
 * copies between [A] matrices. The bias kernels take the activation dtype
 * through backend_cpu_act's wrappers like every kernel with [A] operands;
 * the copy moves elements of whatever size [A] has. And bitsandbytes' 4-bit
 * dequantization (core/quant4), which the CUDA backend's kernel must equal.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend_cpu_act.h"
#include "core/devemu.h"
#include "core/dtype.h"
#include "core/quant4.h"
#include "core/util.h"

static void f32_bias_forward(float *out, const float *bias, int N, int OC)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(bias);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++)
            row[o] += bias[o];
    }
}

/* Each thread a range of columns, summed over the rows in order: the same
 * bits whatever the thread count. */
static void f32_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    DEVEMU_VIEW(dbias);
    DEVEMU_VIEW(dout);
#pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float sum = 0.0f;
        for (int n = 0; n < N; n++)
            sum += dout[(size_t)n * OC + o];
        dbias[o] += sum;
    }
}

void backend_bias_forward(float *out, const float *bias, int N, int OC)
{
    ACT_DISPATCH(act_bias_forward(f32_bias_forward, out, bias, N, OC));
    f32_bias_forward(out, bias, N, OC);
}

void backend_matmul_forward_transposed_bias(float *out, const float *inp, const float *weight, const float *bias, int N,
                                            int C, int OC)
{
    backend_matmul_forward_transposed(out, inp, weight, N, C, OC);
    if (bias)
        backend_bias_forward(out, bias, N, OC);
}

void backend_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    if (!dbias)
        return;
    ACT_DISPATCH(act_bias_backward(f32_bias_backward, dbias, dout, N, OC));
    f32_bias_backward(dbias, dout, N, OC);
}

void backend_copy_cols(float *dst, int dst_ld, int dst_col, const float *src, int src_ld, int src_col, int N,
                       int width)
{
#ifdef BACKEND_CPU_NO_ACT /* the kernel checker's reference: fp32 only (backend_cpu_act.h) */
    const size_t es = sizeof(float);
#else
    const size_t es = (size_t)dtype_size(backend_act_dtype());
#endif
    char *d = devemu_host(dst);
    const char *s = devemu_host(src);
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        memcpy(d + ((size_t)n * dst_ld + dst_col) * es, s + ((size_t)n * src_ld + src_col) * es, (size_t)width * es);
}

void backend_dequant4(void *out, enum dtype out_dt, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                      const float *nested_absmax, const float *offset, size_t first_block, size_t n, int type)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(codes);
    if (qabsmax) {
        DEVEMU_VIEW(qabsmax);
        DEVEMU_VIEW(nested_absmax);
        DEVEMU_VIEW(offset);
    } else {
        DEVEMU_VIEW(absmax);
    }
    quant4_dequantize_stored((enum quant4_type)type, codes, absmax, qabsmax, nested_absmax, qabsmax ? *offset : 0.0f,
                             first_block, n, out, out_dt);
}
