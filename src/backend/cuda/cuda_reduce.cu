/*
 * CUDA backend, reductions and the optimizer: sums of squares (gradient clipping) and the finite
 * check in a fixed order, and the fused multi-tensor AdamW step.
 */
#include "cuda_internal.h"

/* ---- reductions ------------------------------------------------------------------------------ */

/* Per-block partial sums of squares in double, each block's slice in a fixed order. */
__global__ static void sum_squares_kernel(double *partials, const float *x, size_t n)
{
    __shared__ double shared[BLOCK];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int half = BLOCK / 2; half > 0; half /= 2) {
        if (threadIdx.x < half)
            shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partials[blockIdx.x] = shared[0];
}

__global__ static void finite_kernel(int *flag, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (!isfinite(x[i]))
            *flag = 0; /* every writer writes the same value */
}

extern "C" double backend_sum_squares(const float *x, size_t n)
{
    unsigned blocks = blocks_for(n, BLOCK);
    blocks = blocks < MAX_REDUCE_BLOCKS ? blocks : MAX_REDUCE_BLOCKS;
    order_host(x, n * sizeof *x);
    sum_squares_kernel<<<blocks, BLOCK, 0, g_stream>>>(g_partials, x, n);
    cudaCheck(cudaMemcpyAsync(g_partials_h, g_partials, blocks * sizeof(double), cudaMemcpyDeviceToHost, g_stream));
    stream_wait();
    double s = 0.0;
    for (unsigned b = 0; b < blocks; b++)
        s += g_partials_h[b];
    return s;
}

extern "C" int backend_all_finite(const float *x, size_t n)
{
    int one = 1, flag = 0;
    order_host(x, n * sizeof *x);
    cudaCheck(cudaMemcpyAsync(g_flag, &one, sizeof one, cudaMemcpyHostToDevice, g_stream));
    finite_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(g_flag, x, n);
    cudaCheck(cudaMemcpyAsync(&flag, g_flag, sizeof flag, cudaMemcpyDeviceToHost, g_stream));
    stream_wait();
    return flag;
}

/* The per-unit partial sums of backend_sum_squares_multi share g_partials:
 * each unit gets MAX_REDUCE_BLOCKS / count blocks (at least one), units in
 * groups of at most MAX_REDUCE_BLOCKS. */
extern "C" double backend_sum_squares_multi(const float *const *x, const size_t *n, int count)
{
    double total = 0.0;
    for (int first = 0; first < count; first += MAX_REDUCE_BLOCKS) {
        int group = count - first < MAX_REDUCE_BLOCKS ? count - first : MAX_REDUCE_BLOCKS;
        unsigned per = MAX_REDUCE_BLOCKS / (unsigned)group, used[MAX_REDUCE_BLOCKS];
        unsigned at = 0;
        for (int k = 0; k < group; k++) {
            size_t len = n[first + k];
            unsigned blocks = blocks_for(len, BLOCK);
            blocks = blocks < per ? blocks : per;
            used[k] = len ? blocks : 0;
            if (!len)
                continue;
            order_host(x[first + k], len * sizeof(float));
            sum_squares_kernel<<<blocks, BLOCK, 0, g_stream>>>(g_partials + at, x[first + k], len);
            at += blocks;
        }
        if (at)
            cudaCheck(cudaMemcpyAsync(g_partials_h, g_partials, at * sizeof(double), cudaMemcpyDeviceToHost,
                                      g_stream));
        stream_wait();
        at = 0;
        for (int k = 0; k < group; k++) {
            double s = 0.0;
            for (unsigned b = 0; b < used[k]; b++)
                s += g_partials_h[at + b];
            at += used[k];
            total += s;
        }
    }
    return total;
}

/* ---- the fused AdamW step ------------------------------------------------------------------------ */

/* Multi-tensor apply: one launch updates up to ADAMW_GROUP ranges, each cut
 * into chunks of ADAMW_CHUNK elements, one block per chunk; the table travels
 * as the kernel's argument (about 2 KB, under CUDA's 4 KB limit). */
#define ADAMW_GROUP 32
#define ADAMW_CHUNK 4096

struct adamw_group {
    float *param[ADAMW_GROUP], *m[ADAMW_GROUP], *v[ADAMW_GROUP];
    const float *grad[ADAMW_GROUP];
    void *out[ADAMW_GROUP];
    size_t n[ADAMW_GROUP];
    float decay[ADAMW_GROUP], l2[ADAMW_GROUP];
    unsigned first_block[ADAMW_GROUP + 1];
    int count;
};

/* adamw.c's scalar arithmetic, operation for operation (IEEE sqrt and
 * division: this file is built without fast math), so the device gives the
 * host's bits. */
__global__ static void adamw_kernel(struct adamw_group g, struct adamw_coeffs c, enum dtype out_dt)
{
    int k = 0;
    while (k + 1 < g.count && blockIdx.x >= g.first_block[k + 1])
        k++;
    const size_t begin = (size_t)(blockIdx.x - g.first_block[k]) * ADAMW_CHUNK;
    const size_t end = begin + ADAMW_CHUNK < g.n[k] ? begin + ADAMW_CHUNK : g.n[k];
    float *param = g.param[k], *m = g.m[k], *v = g.v[k];
    const float *grad = g.grad[k];
    const float decay = g.decay[k], l2 = g.l2[k];
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float p = param[i];
        float gr = grad[i] * c.grad_scale;
        if (l2 != 0.0f)
            gr = fmaf(l2, p, gr);
        const float mi = fmaf(c.one_minus_beta1, gr, c.beta1 * m[i]);
        const float vi = fmaf(c.one_minus_beta2, gr * gr, c.beta2 * v[i]);
        const float denom = fmaf(sqrtf(vi), c.inv_sqrt_bc2, c.eps);
        const float pn = fmaf(c.neg_step_size, mi / denom, p * decay);
        m[i] = mi;
        v[i] = vi;
        param[i] = pn;
        if (g.out[k])
            store_from_f32(g.out[k], out_dt, i, pn);
    }
}

extern "C" void backend_adamw(const struct adamw_range *r, int count, const struct adamw_hparams *hp,
                              enum dtype out_dtype)
{
    struct adamw_hparams h = *hp;
    struct adamw_group g;
    for (int first = 0; first < count; first += ADAMW_GROUP) {
        memset(&g, 0, sizeof g);
        struct adamw_coeffs c = adamw_make_coeffs(&h);
        unsigned blocks = 0;
        for (int k = 0; k < ADAMW_GROUP && first + k < count; k++) {
            const struct adamw_range *x = &r[first + k];
            h.weight_decay = x->weight_decay;
            struct adamw_coeffs ck = adamw_make_coeffs(&h);
            g.param[g.count] = x->param;
            g.m[g.count] = x->m;
            g.v[g.count] = x->v;
            g.grad[g.count] = x->grad;
            g.out[g.count] = x->param_out;
            g.n[g.count] = x->n;
            g.decay[g.count] = ck.decay;
            g.l2[g.count] = ck.l2;
            g.first_block[g.count] = blocks;
            blocks += (unsigned)((x->n + ADAMW_CHUNK - 1) / ADAMW_CHUNK);
            g.count++;
        }
        g.first_block[g.count] = blocks;
        if (blocks)
            adamw_kernel<<<blocks, BLOCK, 0, g_stream>>>(g, c, out_dtype);
    }
    /* the parameters may be pinned host memory (offload_param) that the host reads next */
    stream_wait();
}
