/*
 * selftest — the emulation's own checks (tests/t_cudaemu.sh): each mode runs
 * one case; "pass" modes must exit 0, the others must fail with a message
 * containing their expected text (selftest --expect MODE prints it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "nccl.h"
#include "cuda_runtime.h"
#include "mma.h"

struct mode {
    const char *name, *expect;
    int (*run)(void);
};

__global__ void divergent_barrier(float *x)
{
    if (threadIdx.x < 16)
        __syncthreads();
    x[threadIdx.x] = 1.0f;
    __syncthreads();
}

__global__ void block_sum(float *out, const float *x)
{
    __shared__ float partial[8];
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0)
        partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++)
            s += partial[w];
        out[blockIdx.x] = s;
    }
}

__global__ void shuffle_after_exit(float *x)
{
    if (threadIdx.x == 3)
        return;
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
}

static float *dev(size_t n)
{
    float *p;
    if (cudaMalloc(&p, n * sizeof *p) != cudaSuccess)
        exit(3);
    return p;
}

static int run_block_sum(void)
{
    float *x = dev(4 * 256), *out = dev(4);
    for (int i = 0; i < 4 * 256; i++)
        x[i] = (float)(i % 7);
    cudaemu_launch("block_sum", __FILE__, __LINE__, [&] { block_sum(out, x); }, 4, 256);
    cudaDeviceSynchronize();
    for (int b = 0; b < 4; b++) {
        float want = 0.0f;
        for (int i = 0; i < 256; i++)
            want += (float)((b * 256 + i) % 7);
        if (out[b] != want)
            return printf("block %d: %g want %g\n", b, out[b], want), 1;
    }
    return 0;
}

static int run_divergent(void)
{
    float *x = dev(64);
    cudaemu_launch("divergent_barrier", __FILE__, __LINE__, [&] { divergent_barrier(x); }, 1, 64);
    cudaDeviceSynchronize();
    return 0;
}

static int run_shuffle_exit(void)
{
    float *x = dev(32);
    cudaemu_launch("shuffle_after_exit", __FILE__, __LINE__, [&] { shuffle_after_exit(x); }, 1, 32);
    cudaDeviceSynchronize();
    return 0;
}

static int run_too_many_threads(void)
{
    float *x = dev(2048);
    cudaemu_launch("block_sum", __FILE__, __LINE__, [&] { block_sum(x, x); }, 1, 1056);
    cudaDeviceSynchronize();
    return 0;
}

static int run_grid_y(void)
{
    float *x = dev(1);
    cudaemu_launch("block_sum", __FILE__, __LINE__, [&] { block_sum(x, x); }, dim3(1, 65536), 32);
    cudaDeviceSynchronize();
    return 0;
}

/* GemmEx against a naive column-major reference, every transpose pair, fp32,
 * and beta 0 over a NaN-filled C. */
static int run_gemm(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 5, n = 4, k = 3, pad = 2;
    float *A = dev(64), *B = dev(64), *C = dev(64);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
            for (int i = 0; i < 64; i++)
                A[i] = (float)(i % 5) - 2, B[i] = (float)(i % 3) + 0.5f, C[i] = NAN;
            float alpha = 1.5f, beta = 0.0f;
            if (cublasGemmEx(h, (cublasOperation_t)ta, (cublasOperation_t)tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B,
                             CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                return printf("gemm %d%d failed\n", ta, tb), 1;
            cudaDeviceSynchronize();
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    float want = 0.0f;
                    for (int l = 0; l < k; l++)
                        want += (ta ? A[l + i * lda] : A[i + l * lda]) * (tb ? B[j + l * ldb] : B[l + j * ldb]);
                    want *= alpha;
                    if (fabsf(C[i + j * ldc] - want) > 1e-5f)
                        return printf("gemm %d%d C(%d,%d) = %g want %g\n", ta, tb, i, j, C[i + j * ldc], want), 1;
                }
        }
    return 0;
}

static int run_bad_lda(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    float *A = dev(64), *B = dev(64), *C = dev(64), alpha = 1.0f, beta = 0.0f;
    /* A not transposed is m x k: lda must be >= m = 5 */
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 5, 2, 3, &alpha, A, CUDA_R_32F, 3, B, CUDA_R_32F, 3,
                                    &beta, C, CUDA_R_32F, 5, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_INVALID_VALUE ? 1 : 0;
}

static int run_gemm_out_of_bounds(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    float *A = dev(8), *B = dev(64), *C = dev(64), alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, &alpha, A, CUDA_R_32F, 4, B, CUDA_R_32F, 3,
                                    &beta, C, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_EXECUTION_FAILED ? 1 : 0;
}

/* ---- cuBLASLt: bad epilogue arguments are refused, and say why ---- */

/* D (m x 16) = A (m x 8) @ B (8 x 16), fp32, with `epilogue`, its bias and aux (aux_ld), A at a_offset floats
 * into its allocation; the status of the heuristic, or of cublasLtMatmul after it. */
static cublasStatus_t lt_case(int m, uint32_t epilogue, const float *bias, float *aux, int64_t aux_ld, int a_offset)
{
    const int n = 16, k = 8;
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref); /* default: operands 256-byte aligned */
    float *A = dev(m * k + a_offset) + a_offset, *B = dev(k * n), *D = dev(m * n), alpha = 1.0f, beta = 0.0f;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, ld, ld, pref, 1, &r, &found);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(h, d, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &r.algo, NULL, 0, 0);
    cudaDeviceSynchronize();
    return s;
}

static int run_lt_aux_ld(void)
{
    float *aux = dev(24 * 16);
    return lt_case(20, CUBLASLT_EPILOGUE_GELU_AUX, NULL, aux, 20, 0) == CUBLAS_STATUS_INVALID_VALUE;
}

static int run_lt_bias_short(void)
{
    float *bias = dev(15); /* D has 16 rows */
    return lt_case(16, CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0, 0) == CUBLAS_STATUS_INVALID_VALUE;
}

static int run_lt_misaligned(void)
{
    float *bias = dev(16);
    return lt_case(16, CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0, 1) == CUBLAS_STATUS_INVALID_VALUE;
}

/* ---- lazy streams: an ordering bug must change the result ---- */

__global__ void store_value(float *x, float v) { x[threadIdx.x] = v; }
__global__ void copy_values(float *dst, const float *src) { dst[threadIdx.x] = src[threadIdx.x]; }

static cudaStream_t stream(unsigned flags)
{
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, flags) != cudaSuccess)
        exit(3);
    return s;
}

/* The host reads mapped pinned memory a kernel writes, without synchronising: the old value. */
static int run_stale_mapped(void)
{
    float *h;
    if (cudaHostAlloc(&h, 32 * sizeof *h, cudaHostAllocMapped) != cudaSuccess)
        exit(3);
    memset(h, 0, 32 * sizeof *h);
    cudaStream_t s = stream(cudaStreamNonBlocking);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(h, 1.0f); }, 1, 32, 0, s);
    float seen = h[0]; /* the bug: no cudaStreamSynchronize(s) first */
    cudaStreamSynchronize(s);
    if (h[0] != 1.0f)
        return printf("after cudaStreamSynchronize the host reads %g, want 1\n", h[0]), 2;
    if (seen == 0.0f)
        return printf("stale value observed: the host read %g before the kernel's 1 was synchronised\n", seen), 1;
    return printf("the unsynchronised read saw %g: the emulation ran the kernel eagerly\n", seen), 0;
}

/* A kernel on stream B reads what a kernel on stream A writes, without an event wait (wait 0) or with one (1). */
static float cross_stream(int wait)
{
    float *x = dev(32), *y = dev(32), got;
    cudaMemset(x, 0, 32 * sizeof *x);
    cudaMemset(y, 0, 32 * sizeof *y);
    cudaDeviceSynchronize();
    cudaStream_t a = stream(cudaStreamNonBlocking), b = stream(cudaStreamNonBlocking);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(x, 1.0f); }, 1, 32, 0, a);
    if (wait) {
        cudaEventRecord(e, a);
        cudaStreamWaitEvent(b, e, 0);
    }
    cudaemu_launch("copy_values", __FILE__, __LINE__, [=] { copy_values(y, x); }, 1, 32, 0, b);
    cudaStreamSynchronize(b);
    cudaStreamSynchronize(a);
    cudaMemcpy(&got, y, sizeof got, cudaMemcpyDeviceToHost);
    return got;
}

static int run_stale_cross_stream(void)
{
    float got = cross_stream(0);
    if (got == 0.0f)
        return printf("stale value observed: stream B read %g, stream A's 1 not waited for\n", got), 1;
    return printf("stream B read %g without an event wait: the emulation ran stream A first\n", got), 0;
}

static int run_event_orders(void)
{
    float got = cross_stream(1);
    return got == 1.0f ? 0 : (printf("stream B read %g after waiting for stream A's event, want 1\n", got), 1);
}

/* cudaEventQuery answers cudaErrorNotReady while the work is pending, then cudaSuccess (a polling loop ends). */
static int run_event_query_polls(void)
{
    float *h;
    cudaHostAlloc(&h, 32 * sizeof *h, cudaHostAllocMapped);
    memset(h, 0, 32 * sizeof *h);
    cudaStream_t s = stream(cudaStreamNonBlocking);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(h, 2.0f); }, 1, 32, 0, s);
    cudaEventRecord(e, s);
    int not_ready = 0;
    cudaError_t r;
    while ((r = cudaEventQuery(e)) == cudaErrorNotReady)
        if (++not_ready > 100)
            return printf("cudaEventQuery never ready\n"), 1;
    if (r != cudaSuccess || (not_ready == 0) != cudaemu_eager() || h[0] != 2.0f)
        return printf("query %d after %d not-ready answers, value %g\n", (int)r, not_ready, h[0]), 1;
    return 0;
}

/* The legacy default stream: cudaMemcpy waits for a blocking stream's kernel, not a non-blocking one's. */
static float legacy_after(unsigned flags)
{
    float *x = dev(32), got = -1.0f;
    cudaMemset(x, 0, 32 * sizeof *x);
    cudaDeviceSynchronize();
    cudaStream_t s = stream(flags);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(x, 3.0f); }, 1, 32, 0, s);
    cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost);
    cudaStreamSynchronize(s);
    return got;
}

static int run_legacy_blocking(void)
{
    float got = legacy_after(cudaStreamDefault);
    return got == 3.0f ? 0 : (printf("cudaMemcpy after a blocking stream's kernel read %g, want 3\n", got), 1);
}

static int run_legacy_nonblocking(void)
{
    float got = legacy_after(cudaStreamNonBlocking);
    if (got == 0.0f)
        return printf("stale value observed: cudaMemcpy does not wait for a non-blocking stream\n"), 1;
    return printf("cudaMemcpy read %g: it waited for a non-blocking stream\n", got), 0;
}

/* ---- the NCCL stand-in: a collective's result lands when its stream completes it ---- */

static ncclComm_t one_rank_comm(void)
{
    int init = 0;
    MPI_Initialized(&init);
    if (!init)
        MPI_Init(NULL, NULL);
    ncclUniqueId id;
    ncclComm_t comm;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess)
        exit(3);
    return comm;
}

/* A kernel on the compute stream reads an all-reduce's output; wait 1: after waiting for its event. */
static float collective_then_read(int wait)
{
    ncclComm_t comm = one_rank_comm();
    float *send = dev(32), *recv = dev(32), *out = dev(32), got = -1.0f;
    cudaStream_t compute = stream(cudaStreamNonBlocking), nccl = stream(cudaStreamNonBlocking);
    cudaEvent_t ready, done;
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(send, 4.0f); }, 1, 32, 0, compute);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(recv, 0.0f); }, 1, 32, 0, compute);
    cudaEventRecord(ready, compute);
    cudaStreamWaitEvent(nccl, ready, 0);
    ncclAllReduce(send, recv, 32, ncclFloat32, ncclSum, comm, nccl);
    cudaEventRecord(done, nccl);
    if (wait)
        cudaStreamWaitEvent(compute, done, 0);
    cudaemu_launch("copy_values", __FILE__, __LINE__, [=] { copy_values(out, recv); }, 1, 32, 0, compute);
    cudaStreamSynchronize(compute);
    cudaStreamSynchronize(nccl);
    cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost);
    return got;
}

static int run_stale_collective(void)
{
    float got = collective_then_read(0);
    if (got == 0.0f)
        return printf("stale value observed: a kernel read the all-reduce's output %g without waiting for it\n", got),
               1;
    return printf("a kernel read %g from the all-reduce's output without waiting for its event\n", got), 0;
}

static int run_collective_waited(void)
{
    float got = collective_then_read(1);
    return got == 4.0f ? 0 : (printf("read %g after waiting for the all-reduce, want 4\n", got), 1);
}

/* A kernel on the compute stream overwrites an all-gather's sendbuff before the collective has completed. */
static int run_collective_send_overwritten(void)
{
    ncclComm_t comm = one_rank_comm();
    float *send = dev(32), *recv = dev(64);
    cudaStream_t compute = stream(cudaStreamNonBlocking), nccl = stream(cudaStreamNonBlocking);
    cudaEvent_t ready;
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventRecord(ready, compute);
    cudaStreamWaitEvent(nccl, ready, 0);
    ncclAllGather(send, recv, 32, ncclFloat32, comm, nccl);
    cudaemu_launch("store_value", __FILE__, __LINE__, [=] { store_value(send, 5.0f); }, 1, 32, 0, compute);
    cudaStreamSynchronize(compute);
    cudaStreamSynchronize(nccl);
    return 0;
}


/* wmma: per warp, D = A B + C on 16 x 16 tiles (A row-major and B column-major in bf16, or A column-major and B
 * row-major in fp16), stored row- or column-major; `lanes` of each warp take part (32: all). */
template <typename T, typename LA, typename LB>
__global__ void wmma_product(float *d, const T *a, const T *b, const float *c, int store_row_major, int lanes, int skew)
{
    using namespace nvcuda;
    if ((int)threadIdx.x % 32 >= lanes)
        return;
    const int w = (int)threadIdx.x / 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a + w * 256 + skew, 16);
    wmma::load_matrix_sync(fb, b + w * 256, 16);
    wmma::load_matrix_sync(fc, c + w * 256, 16, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d + w * 256, fc, 16, store_row_major ? wmma::mem_row_major : wmma::mem_col_major);
}

/* Two warps of each operand layout against the product in double: small integers and halves, so every product
 * and sum is exact in fp32 and the results must be equal. lanes < 32 or skew: the failure cases. */
template <typename T, typename LA, typename LB> static int wmma_case(T (*to)(float), int lanes, int skew)
{
    const bool a_rows = std::is_same<LA, nvcuda::wmma::row_major>::value;
    const bool b_rows = std::is_same<LB, nvcuda::wmma::row_major>::value;
    T *a, *b;
    float *c = dev(512), *d = dev(512);
    cudaMalloc(&a, 512 * sizeof *a + 64);
    cudaMalloc(&b, 512 * sizeof *b);
    float av[512], bv[512];
    for (int i = 0; i < 512; i++) {
        av[i] = (float)(i * 7 % 11 - 5) * 0.5f;
        bv[i] = (float)(i * 5 % 13 - 6);
        a[i + skew] = to(av[i]);
        b[i] = to(bv[i]);
        c[i] = (float)(i % 9) - 4.0f;
    }
    for (int store_rows = 0; store_rows < 2; store_rows++) {
        cudaemu_launch("wmma_product", __FILE__, __LINE__,
                       [=] { wmma_product<T, LA, LB>(d, a, b, c, store_rows, lanes, skew); }, 1, 64);
        cudaDeviceSynchronize();
        for (int w = 0; w < 2; w++)
            for (int r = 0; r < 16; r++)
                for (int col = 0; col < 16; col++) {
                    double want = c[w * 256 + r * 16 + col];
                    for (int k = 0; k < 16; k++)
                        want += (double)av[w * 256 + (a_rows ? r * 16 + k : k * 16 + r)] *
                                bv[w * 256 + (b_rows ? k * 16 + col : col * 16 + k)];
                    const float got = d[w * 256 + (store_rows ? r * 16 + col : col * 16 + r)];
                    if (got != want)
                        return printf("warp %d (%d, %d): %g want %g\n", w, r, col, got, want), 1;
                }
    }
    return 0;
}

static __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }
static __half to_half(float x) { return __float2half_rn(x); }

static int run_wmma_product(void)
{
    using namespace nvcuda;
    return wmma_case<__nv_bfloat16, wmma::row_major, wmma::col_major>(to_bf16, 32, 0) ||
           wmma_case<__half, wmma::col_major, wmma::row_major>(to_half, 32, 0);
}

static int run_wmma_misaligned(void)
{
    return wmma_case<__half, nvcuda::wmma::row_major, nvcuda::wmma::row_major>(to_half, 32, 1);
}

static int run_wmma_divergent(void)
{
    return wmma_case<__half, nvcuda::wmma::row_major, nvcuda::wmma::row_major>(to_half, 16, 0);
}

static const mode g_modes[] = {
    {"block_sum", "pass", run_block_sum},
    {"gemm_reference", "pass", run_gemm},
    {"divergent_syncthreads", "a barrier in divergent code", run_divergent},
    {"shuffle_with_exited_lane", "has exited", run_shuffle_exit},
    {"block_of_1056_threads", "at most 1024", run_too_many_threads},
    {"grid_y_65536", "grid dimensions", run_grid_y},
    {"gemm_lda_too_small", "lda 3 < max(1, rows of A as stored = 5)", run_bad_lda},
    {"gemm_operand_past_allocation", "not inside one device allocation", run_gemm_out_of_bounds},
    {"lt_aux_ld_not_multiple_of_8", "EPILOGUE_AUX_LD 20 must be >= the rows of D (20) and divisible by 8",
     run_lt_aux_ld},
    {"lt_bias_past_allocation", "the bias vector is not inside one device allocation", run_lt_bias_short},
    {"lt_operand_below_preferred_alignment", "less aligned than the 256 bytes", run_lt_misaligned},
    {"stale_mapped_host_read", "stale value observed", run_stale_mapped},
    {"stale_cross_stream_read", "stale value observed", run_stale_cross_stream},
    {"event_wait_orders_streams", "pass", run_event_orders},
    {"event_query_polls", "pass", run_event_query_polls},
    {"legacy_stream_waits_for_blocking", "pass", run_legacy_blocking},
    {"legacy_stream_ignores_nonblocking", "stale value observed", run_legacy_nonblocking},
    {"stale_collective_output_read", "stale value observed", run_stale_collective},
    {"collective_output_after_event_wait", "pass", run_collective_waited},
    {"collective_sendbuff_overwritten", "ordering hazard: ncclAllGather's sendbuff", run_collective_send_overwritten},
    {"wmma_product", "pass", run_wmma_product},
    {"wmma_load_misaligned", "must be 32-byte aligned", run_wmma_misaligned},
    {"wmma_in_divergent_code", "has exited", run_wmma_divergent},
};

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the message comes out before an abort */
    const size_t n = sizeof g_modes / sizeof g_modes[0];
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) /* CUDAEMU_EAGER=1 runs every operation at the call: nothing is stale */
            if (!(cudaemu_eager() && (strstr(g_modes[i].expect, "stale") || strstr(g_modes[i].expect, "ordering"))))
                printf("%s\n", g_modes[i].name);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (argc == 3 && strcmp(argv[1], "--expect") == 0 && strcmp(argv[2], g_modes[i].name) == 0)
            return printf("%s\n", g_modes[i].expect), 0;
        if (argc == 2 && strcmp(argv[1], g_modes[i].name) == 0)
            return g_modes[i].run();
    }
    fprintf(stderr, "usage: selftest --list | --expect MODE | MODE\n");
    return 2;
}
