/*
 * CUDA backend: backend.h on device pointers (DESIGN §9).
 *
 * Matmuls (attention's included) go through cublasGemmEx, or cublasLtMatmul
 * where an epilogue folds in bias, GELU or the bias gradient (see "matmuls
 * with an epilogue"), with fp32 accumulation, on [A] operands (backend.h: fp32, or fp16/bf16 when training
 * in half precision, on tensor cores); TF32 only when SHARDLM_TF32=1 and only
 * for fp32 storage. Every other kernel loads [A] elements into fp32
 * registers, computes in fp32 and rounds its [A] outputs to nearest even:
 * the statistics of layernorm and RMSNorm, softmax, rotary tables, SwiGLU's
 * sigmoid, cross-entropy and the loss are fp32 always.
 * Row-major tensors are handed to column-major cuBLAS as their transposes: a
 * row-major (R, S) matrix is a column-major (S, R) one, so out = inp @ W
 * becomes out^T = W^T @ inp^T with the operands swapped.
 *
 * Every reduction has a fixed order (no atomics), so results are the same
 * from run to run: bit-exact resume holds on the GPU as on the CPU.
 *
 * All work is on one stream per process (backend_cuda_stream()); the
 * functions that return a value to the host (sum of squares, finite check,
 * copies) wait for it, never forever (stream_wait).
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention_tc.h"
#include "cuda_check.h"

extern "C" {
#include "core/adamw.h"
#include "backend/backend.h"
#include "backend/device_select.h"
}

#define LAYERNORM_EPS 1e-5f /* GPT-2's layer_norm_epsilon */
#define WARP 32
#define BLOCK 256

static cublasHandle_t g_cublas;
static cublasLtHandle_t g_cublaslt; /* the matmuls with a fused epilogue (lt_matmul) */
static void *g_workspace;            /* the plan's library workspace (backend_set_library_workspace) */
static size_t g_workspace_bytes;
static cudaStream_t g_stream;
static cublasComputeType_t g_compute = CUBLAS_COMPUTE_32F;
static double *g_partials;   /* device: per-block partial sums */
static double *g_partials_h; /* pinned host copy */
static int *g_flag;          /* device: finite check */
#define MAX_REDUCE_BLOCKS 1024
/* Column sums over many rows (bias and layernorm gradients) in two fixed-order
 * stages: row chunks in parallel into g_colsum, then the chunks in order. */
#define COLSUM_FLOATS (1u << 20)
#define COLSUM_MAX_CHUNKS 64
static float *g_colsum;

static cudaEvent_t g_sync_event;
/* The copy stream: device-to-pinned-host transfers (a reduced gradient shard
 * added into the pinned fp32 shard, casts into pinned memory) run there, beside
 * the kernels of the next unit. g_fork orders it after the kernels issued so
 * far; g_copy_done marks its last transfer, which the kernels' stream waits
 * for before it next touches host memory or is waited on (join_copies), and
 * the NCCL stream before its next collective (backend_cuda_copy_event), as a
 * transfer's source may be the shared reduce-scatter receive buffer. */
static cudaStream_t g_copy;
static cudaEvent_t g_fork, g_copy_done;
static int g_copy_pending;
static double g_sync_timeout = 600.0;     /* SHARDLM_COMM_TIMEOUT, as for MPI collectives */
static const char *(*g_watchdog)(void);   /* comm_nccl: a message when NCCL has failed */

/* Waits for the stream like cudaStreamSynchronize, but never forever: work
 * queued behind a collective that waits for a dead rank would block the host
 * for good, so the wait polls, asks the NCCL watchdog, and after the timeout
 * ends the job (fail_internal: the abort hooks abort NCCL and MPI). */
/* The device arenas (backend_mem_alloc): a copy between two of them is
 * ordered on the stream like a kernel and needs no wait by the host. */
#define MAX_DEVICE_RANGES 64
static struct {
    const char *base;
    size_t bytes;
} g_device_ranges[MAX_DEVICE_RANGES];
static int g_n_device_ranges;

static int in_device_arena(const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    for (int i = 0; i < g_n_device_ranges; i++)
        if (c >= g_device_ranges[i].base && bytes <= g_device_ranges[i].bytes &&
            (size_t)(c - g_device_ranges[i].base) <= g_device_ranges[i].bytes - bytes)
            return 1;
    return 0;
}

static void join_copies(void);

/* Before a kernel of the compute stream touches host (pinned) memory: the
 * copy stream's transfers into it come first. */
static void order_host(const void *p, size_t bytes)
{
    if (g_copy_pending && bytes && !in_device_arena(p, bytes))
        join_copies();
}

/* The stream for a kernel that writes dst (dst_bytes) from src (src_bytes):
 * the copy stream when it moves device memory into host memory, ordered after
 * the kernels issued so far; else the compute stream, after the copy stream's
 * transfers if either side is host memory. End a copy-stream kernel with
 * copy_issued(). */
static cudaStream_t transfer_stream(const void *dst, size_t dst_bytes, const void *src, size_t src_bytes)
{
    if (in_device_arena(dst, dst_bytes) || !in_device_arena(src, src_bytes)) {
        order_host(dst, dst_bytes);
        order_host(src, src_bytes);
        return g_stream;
    }
    cudaCheck(cudaEventRecord(g_fork, g_stream));
    cudaCheck(cudaStreamWaitEvent(g_copy, g_fork, 0));
    return g_copy;
}

static void copy_issued(cudaStream_t s)
{
    if (s != g_copy)
        return;
    cudaCheck(cudaEventRecord(g_copy_done, g_copy));
    g_copy_pending = 1;
}

static void join_copies(void)
{
    if (g_copy_pending) {
        cudaCheck(cudaStreamWaitEvent(g_stream, g_copy_done, 0));
        g_copy_pending = 0;
    }
}

static void stream_wait(void)
{
    /* a launch with a bad configuration is only reported here, by the runtime's last error */
    cudaCheck(cudaGetLastError());
    join_copies(); /* the copy stream's transfers too */
    cudaCheck(cudaEventRecord(g_sync_event, g_stream));
    double t0 = now_seconds();
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(g_sync_event);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            cudaCheck(e);
        const char *failed = g_watchdog ? g_watchdog() : NULL;
        if (failed)
            fail_internal("%s", failed);
        if (now_seconds() - t0 > g_sync_timeout)
            fail_internal("the GPU's queued work did not finish within %.0f s: a collective probably waits for a "
                          "rank that died or hangs (SHARDLM_COMM_TIMEOUT sets the limit)",
                          g_sync_timeout);
        if (spins > 1000) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 * 16 ? (b ? b : 1) : 65535 * 16);
}

extern "C" void backend_init(int threads)
{
    (void)threads;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    char why[256];
    int device = device_select_from_env(e == cudaSuccess ? count : 0,
                                        e == cudaSuccess ? NULL : cudaGetErrorString(e), why, sizeof why);
    if (device < 0)
        fail_input("%s", why);
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&g_cublas));
    cublasCheck(cublasSetStream(g_cublas, g_stream));
    cublasCheck(cublasLtCreate(&g_cublaslt));
    const char *tf32 = getenv("SHARDLM_TF32");
    if (tf32 && strcmp(tf32, "1") == 0)
        g_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    cudaCheck(cudaMalloc(&g_partials, MAX_REDUCE_BLOCKS * sizeof(double)));
    cudaCheck(cudaMallocHost(&g_partials_h, MAX_REDUCE_BLOCKS * sizeof(double)));
    cudaCheck(cudaMalloc(&g_flag, sizeof(int)));
    cudaCheck(cudaMalloc(&g_colsum, COLSUM_FLOATS * sizeof(float)));
    cudaCheck(cudaEventCreateWithFlags(&g_sync_event, cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithFlags(&g_copy, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&g_fork, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&g_copy_done, cudaEventDisableTiming));
    const char *timeout = getenv("SHARDLM_COMM_TIMEOUT");
    if (timeout && atof(timeout) > 0)
        g_sync_timeout = atof(timeout);
}

extern "C" void backend_check_performance(void) {}

extern "C" const char *backend_name(void) { return "cuda (cuBLAS, cuBLASLt + own kernels)"; }

extern "C" int backend_is_device(void) { return 1; }

/* ---- activation dtype ([A] in backend.h) ------------------------------------------------ */

static enum dtype g_act = DTYPE_F32;

extern "C" void backend_set_act_dtype(enum dtype dt) { g_act = dt; }
extern "C" enum dtype backend_act_dtype(void) { return g_act; }

/* Weight-gradient dtype ([G] in backend.h). */
static enum dtype g_grad = DTYPE_F32;

extern "C" void backend_set_grad_dtype(enum dtype dt) { g_grad = dt; }
extern "C" enum dtype backend_grad_dtype(void) { return g_grad; }

static cudaDataType_t grad_type(void)
{
    return g_grad == DTYPE_BF16 ? CUDA_R_16BF : g_grad == DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Loads and stores of [A] elements, in fp32 registers; stores round to nearest even. */
__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Runs `body` with A bound to the C type of the activation dtype. */
#define WITH_ACT(...)                           \
    do {                                        \
        if (g_act == DTYPE_BF16) {              \
            typedef __nv_bfloat16 A;            \
            __VA_ARGS__;                        \
        } else if (g_act == DTYPE_F16) {        \
            typedef __half A;                   \
            __VA_ARGS__;                        \
        } else {                                \
            typedef float A;                    \
            __VA_ARGS__;                        \
        }                                       \
    } while (0)

static cudaDataType_t act_type(void)
{
    return g_act == DTYPE_BF16 ? CUDA_R_16BF : g_act == DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}


/* C (col-major m x n, ldc) = alpha op(A) op(B) + beta C. A and B are [A]; C
 * is [A] (c_grad 0) or [G] (1: weight gradients). fp32 accumulation always;
 * TF32 only when configured and only for fp32 storage. */
static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                 int lda, const void *B, int ldb, float beta, void *C, int ldc, int c_grad)
{
    cublasComputeType_t compute = g_act == DTYPE_F32 ? g_compute : CUBLAS_COMPUTE_32F;
    cublasCheck(cublasGemmEx(g_cublas, ta, tb, m, n, k, &alpha, A, act_type(), lda, B, act_type(), ldb, &beta, C,
                             c_grad ? grad_type() : act_type(), ldc, compute, CUBLAS_GEMM_DEFAULT));
}

/* ---- matmul ------------------------------------------------------------------------- */

template <typename A> __global__ static void fill_rows(A *out, const A *row, int N, int OC)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)N * OC;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = row[i % OC];
}

/* Row chunks for `sums` column sums of `cols` columns each over N rows: as many as
 * fit g_colsum (at most COLSUM_MAX_CHUNKS), a function of the shapes only. */
static int colsum_chunks(int N, int cols, int sums)
{
    if ((size_t)cols * sums > COLSUM_FLOATS)
        fail_internal("column sums over %zu columns exceed the %zu-float buffer", (size_t)cols * sums,
                      (size_t)COLSUM_FLOATS);
    int chunks = (int)(COLSUM_FLOATS / ((size_t)cols * sums));
    chunks = chunks < COLSUM_MAX_CHUNKS ? chunks : COLSUM_MAX_CHUNKS;
    chunks = chunks < N ? chunks : N;
    return chunks > 0 ? chunks : 1;
}

/* Stage 1: partial[chunk][c] = sum of dout[:, c] over the chunk's rows, in row order. */
template <typename A>
__global__ static void column_sums_partial(float *partial, const A *dout, int N, int OC, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= OC)
        return;
    int r0 = (int)((long)N * chunk / chunks), r1 = (int)((long)N * (chunk + 1) / chunks);
    float s = 0.0f;
    for (int i = r0; i < r1; i++)
        s += ld(dout, (size_t)i * OC + c);
    partial[(size_t)chunk * OC + c] = s;
}

/* Stage 2: dst[c] += the chunks' partials in chunk order. */
__device__ static float load_as_f32(const void *src, enum dtype dt, size_t i);
__device__ static void store_from_f32(void *dst, enum dtype dt, size_t i, float v);

/* dst [G] (dtype dt): one rounding per element. */
__global__ static void column_sums_finish(void *dst, enum dtype dt, const float *partial, int OC, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++)
        s += partial[(size_t)k * OC + c];
    store_from_f32(dst, dt, c, load_as_f32(dst, dt, c) + s);
}

/* ---- matmuls with an epilogue (cuBLASLt) ----------------------------------------------------------
 *
 * cuBLASLt folds into the matmul what would otherwise be a pass of its own over the output: the bias
 * (EPILOGUE_BIAS), the MLP's bias + GELU keeping the GELU input (GELU_AUX_BIAS), GELU's derivative
 * on the input gradient (DGELU), and the bias gradient from the weight-gradient matmul (BGRADA:
 * row sums of A = dout over k = N). cuBLASLt's GELU is the tanh approximation GPT-2 uses (check_kernels
 * compares it to the CPU's tanh formula within 1e-5 in fp32, which an erf GELU would miss by ~1e-4).
 * BGRAD overwrites its vector (cublasLt.h: "Stores Bias gradient") while the backend's bias gradients
 * accumulate, so it goes to g_colsum and one small kernel adds it. When cuBLASLt has no algorithm for
 * a case (the heuristic answers NOT_SUPPORTED or none) or the aux leading dimension is not a multiple of
 * LT_AUX_LD_MULTIPLE, the unfused kernels compute the same thing. Workspace: the plan's library
 * workspace (backend_set_library_workspace), shared with cuBLAS: both run on g_stream, one after the
 * other. */

#define LT_AUX_LD_MULTIPLE 8 /* cublasLt.h: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD "Must be divisible by 8" */

/* The largest power of two up to 256 that divides p (the alignment preference cuBLASLt must assume). */
static uint32_t alignment_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

struct lt_epilogue {
    cublasLtEpilogue_t kind;
    const void *bias; /* BIAS: [A] (m); BGRADA: fp32 (m), written */
    const void *aux;  /* GELU_AUX: [A] output; DGELU: [A] input; (m x n, ld aux_ld) */
    int64_t aux_ld;
};

/* D (col-major m x n, ldd) = epilogue(op(A) op(B) + beta D), as gemm() (A, B [A]; D [A] or fp32 when
 * d_grad: [G]). Returns 0, having done nothing, when cuBLASLt offers no algorithm for it. */
static int lt_matmul(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
                     const void *B, int ldb, float beta, void *D, int ldd, int d_grad, const struct lt_epilogue *e)
{
    const cublasComputeType_t compute = g_act == DTYPE_F32 ? g_compute : CUBLAS_COMPUTE_32F;
    const cudaDataType_t ab = act_type(), dt = d_grad ? grad_type() : act_type();
    const int32_t opa = ta, opb = tb;
    const uint32_t epilogue = e->kind;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (e->bias)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias));
    if (e->kind == CUBLASLT_EPILOGUE_BGRADA || e->kind == CUBLASLT_EPILOGUE_BGRADB) {
        /* the bias gradient goes to the fp32 g_colsum whatever D's type ([G] may be half precision);
         * the default would be D's type */
        const int32_t f32 = CUDA_R_32F;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof f32));
    }
    if (e->aux) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e->aux,
                                                   sizeof e->aux));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e->aux_ld,
                                                   sizeof e->aux_ld));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&la, ab, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, ab, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t workspace = g_workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof workspace));
    const uint32_t align[4] = {alignment_of(A), alignment_of(B), alignment_of(D), alignment_of(D)};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(
            pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i), &align[i],
            sizeof align[i]));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_cublaslt, desc, la, lb, ld, ld, pref, 1, &result, &found);
    if (s != CUBLAS_STATUS_NOT_SUPPORTED)
        cublasCheck(s);
    const int ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok) {
        const float alpha = 1.0f;
        cublasCheck(cublasLtMatmul(g_cublaslt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &result.algo, g_workspace,
                                   g_workspace_bytes, g_stream));
    }
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return ok;
}

extern "C" void backend_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                                       int C, int OC)
{
    float beta = 0.0f;
    if (bias) {
        const struct lt_epilogue e = {CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0};
        if (lt_matmul(CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, weight, OC, inp, C, 0.0f, out, OC, 0, &e))
            return;
        WITH_ACT(fill_rows<A><<<blocks_for((size_t)N * OC, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)bias,
                                                                                         N, OC));
        beta = 1.0f;
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, 1.0f, weight, OC, inp, C, beta, out, OC, 0);
}

extern "C" void backend_matmul_forward_gelu(float *pre, float *out, const float *inp, const float *weight,
                                            const float *bias, int N, int C, int OC)
{
    if (OC % LT_AUX_LD_MULTIPLE == 0) {
        const struct lt_epilogue e = {bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias, pre,
                                      OC};
        if (lt_matmul(CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, weight, OC, inp, C, 0.0f, out, OC, 0, &e))
            return;
    }
    backend_matmul_forward(pre, inp, weight, bias, N, C, OC);
    backend_gelu_forward(out, pre, (size_t)N * OC);
}

/* dweight (C, OC) += inp^T @ dout; dbias (OC) += column sums of dout (skipped when NULL); nothing when
 * dweight is NULL (frozen weights, backend.h). */
static void weight_and_bias_grad(float *dweight, float *dbias, const float *dout, const float *inp, int N, int C,
                                 int OC)
{
    if (!dweight)
        return;
    if (dbias) {
        if ((size_t)OC > COLSUM_FLOATS)
            fail_internal("a bias of %d elements exceeds the %zu-float column-sum buffer", OC, (size_t)COLSUM_FLOATS);
        const struct lt_epilogue e = {CUBLASLT_EPILOGUE_BGRADA, g_colsum, NULL, 0};
        if (lt_matmul(CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, dout, OC, inp, C, 1.0f, dweight, OC, 1, &e)) {
            column_sums_finish<<<(OC + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad, g_colsum, OC, 1);
            return;
        }
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, OC, 1);
    if (dbias) {
        int chunks = colsum_chunks(N, OC, 1);
        dim3 grid((OC + BLOCK - 1) / BLOCK, chunks);
        WITH_ACT(column_sums_partial<A><<<grid, BLOCK, 0, g_stream>>>(g_colsum, (const A *)dout, N, OC, chunks));
        column_sums_finish<<<(OC + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad, g_colsum, OC, chunks);
    }
}

extern "C" void backend_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, int N, int C, int OC)
{
    if (dinp)
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, 1.0f, weight, OC, dout, OC, 0.0f, dinp, C, 0);
    weight_and_bias_grad(dweight, dbias, dout, inp, N, C, OC);
}

extern "C" void backend_matmul_backward_gelu(float *dpre, float *dweight, float *dbias, const float *dout,
                                             const float *inp, const float *weight, const float *pre, int N, int C,
                                             int OC)
{
    const struct lt_epilogue e = {CUBLASLT_EPILOGUE_DGELU, NULL, pre, C};
    if (C % LT_AUX_LD_MULTIPLE != 0 ||
        !lt_matmul(CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, weight, OC, dout, OC, 0.0f, dpre, C, 0, &e)) {
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, 1.0f, weight, OC, dout, OC, 0.0f, dpre, C, 0);
        backend_gelu_backward(dpre, pre, dpre, (size_t)N * C);
    }
    weight_and_bias_grad(dweight, dbias, dout, inp, N, C, OC);
}

extern "C" void backend_matmul_forward_transposed(float *out, const float *inp, const float *weight, int N, int C,
                                                  int OC)
{
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, weight, C, inp, C, 0.0f, out, OC, 0);
}

extern "C" void backend_matmul_backward_transposed(float *dinp, float *dweight, const float *dout, const float *inp,
                                                   const float *weight, int N, int C, int OC)
{
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, weight, C, dout, OC, 0.0f, dinp, C, 0);
    if (dweight)
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, C, 1);
}

/* ---- layernorm and RMSNorm -------------------------------------------------------------- */

__device__ static float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The two normalisations share their kernels: mean non-NULL is layernorm (centred, bias), mean NULL is RMSNorm
 * (norm = x rstd, no bias). */

/* One warp per row; statistics in fp32 (layernorm: two passes over the row, mean then variance; RMSNorm: the mean
 * square). inp, out [A]. */
template <typename A>
__global__ static void norm_forward_kernel(A *out, float *mean, float *rstd, const A *inp, const A *weight,
                                           const A *bias, float eps, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N)
        return;
    const A *x = inp + (size_t)row * C;
    float m = 0.0f;
    if (mean) {
        float s = 0.0f;
        for (int c = lane; c < C; c += WARP)
            s += ld(x, c);
        m = warp_sum(s) / C;
    }
    float v = 0.0f;
    for (int c = lane; c < C; c += WARP)
        v += (ld(x, c) - m) * (ld(x, c) - m);
    float r = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane; c < C; c += WARP) {
        const float y = (ld(x, c) - m) * r * ld(weight, c);
        st(out, (size_t)row * C + c, bias ? y + ld(bias, c) : y);
    }
    if (lane == 0) {
        if (mean)
            mean[row] = m;
        rstd[row] = r;
    }
}

static void norm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                         const float *bias, float eps, int N, int C)
{
    int rows_per_block = BLOCK / WARP;
    WITH_ACT(norm_forward_kernel<A><<<(N + rows_per_block - 1) / rows_per_block, BLOCK, 0, g_stream>>>(
        (A *)out, mean, rstd, (const A *)inp, (const A *)weight, (const A *)bias, eps, N, C));
}

extern "C" void backend_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                          const float *weight, const float *bias, int N, int C)
{
    norm_forward(out, mean, rstd, inp, weight, bias, LAYERNORM_EPS, N, C);
}

extern "C" void backend_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps,
                                        int N, int C)
{
    norm_forward(out, NULL, rstd, inp, weight, NULL, eps, N, C);
}

/* dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, dnorm = dout * weight; one warp per row.
 * RMSNorm (mean NULL): without the mean(dnorm) term, which the centring brings. */
template <typename A>
__global__ static void norm_backward_input(A *dinp, const A *dout, const A *inp, const A *weight, const float *mean,
                                           const float *rstd, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N)
        return;
    const size_t at = (size_t)row * C;
    const A *x = inp + at;
    float m = mean ? mean[row] : 0.0f, r = rstd[row], a = 0.0f, b = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = ld(dout, at + c) * ld(weight, c);
        a += dnorm;
        b += dnorm * (ld(x, c) - m) * r;
    }
    a = mean ? warp_sum(a) / C : 0.0f;
    b = warp_sum(b) / C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (ld(x, c) - m) * r;
        st(dinp, at + c, ld(dinp, at + c) + (ld(dout, at + c) * ld(weight, c) - a - norm * b) * r);
    }
}

/* Stage 1 of dweight[c] += sum_rows dout * norm and (layernorm) dbias[c] += sum_rows dout:
 * per row chunk, in row order, into partial[chunk][c] and partial[chunks + chunk][c]. */
template <typename A>
__global__ static void norm_backward_params(float *partial, const A *dout, const A *inp, const float *mean,
                                            const float *rstd, int N, int C, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C)
        return;
    int r0 = (int)((long)N * chunk / chunks), r1 = (int)((long)N * (chunk + 1) / chunks);
    float dw = 0.0f, db = 0.0f;
    for (int i = r0; i < r1; i++) {
        float dy = ld(dout, (size_t)i * C + c);
        dw += dy * (ld(inp, (size_t)i * C + c) - (mean ? mean[i] : 0.0f)) * rstd[i];
        db += dy;
    }
    partial[(size_t)chunk * C + c] = dw;
    if (mean)
        partial[(size_t)(chunks + chunk) * C + c] = db;
}

/* dinp [A] +=, dweight [G] +=, dbias [G] += (layernorm: mean and dbias non-NULL; RMSNorm: both NULL);
 * dweight NULL (frozen weights): the input gradient only. */
static void norm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, const float *mean, const float *rstd, int N, int C)
{
    int rows_per_block = BLOCK / WARP;
    WITH_ACT({
        norm_backward_input<A><<<(N + rows_per_block - 1) / rows_per_block, BLOCK, 0, g_stream>>>(
            (A *)dinp, (const A *)dout, (const A *)inp, (const A *)weight, mean, rstd, N, C);
    });
    if (!dweight)
        return;
    int chunks = colsum_chunks(N, C, dbias ? 2 : 1);
    dim3 grid((C + BLOCK - 1) / BLOCK, chunks);
    WITH_ACT(norm_backward_params<A><<<grid, BLOCK, 0, g_stream>>>(g_colsum, (const A *)dout, (const A *)inp, mean,
                                                                    rstd, N, C, chunks));
    column_sums_finish<<<(C + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dweight, g_grad, g_colsum, C, chunks);
    if (dbias)
        column_sums_finish<<<(C + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad,
                                                                             g_colsum + (size_t)chunks * C, C, chunks);
}

extern "C" void backend_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                           const float *inp, const float *weight, const float *mean,
                                           const float *rstd, float *scratch, int N, int C)
{
    (void)scratch;
    norm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

extern "C" void backend_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                         const float *weight, const float *rstd, float *scratch, int N, int C)
{
    (void)scratch;
    norm_backward(dinp, dweight, NULL, dout, inp, weight, NULL, rstd, N, C);
}

extern "C" size_t backend_layernorm_scratch(int C)
{
    (void)C;
    return 0;
}

/* ---- element-wise ---------------------------------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

template <typename A> __global__ static void gelu_forward_kernel(A *out, const A *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i);
        st(out, i, 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
}

template <typename A> __global__ static void gelu_backward_kernel(A *dinp, const A *inp, const A *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i), u = GELU_SCALE * (x + 0.044715f * x * x * x), t = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        st(dinp, i, (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * ld(dout, i));
    }
}

/* out = a + b, b in B (float for backend_add, [A] for backend_add_act). */
template <typename B> __global__ static void add_kernel(float *out, const float *a, const B *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + ld(b, i);
}

__global__ static void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" void backend_gelu_forward(float *out, const float *inp, size_t n)
{
    WITH_ACT(gelu_forward_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)inp, n));
}

extern "C" void backend_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    WITH_ACT(gelu_backward_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)dinp, (const A *)inp,
                                                                                  (const A *)dout, n));
}

extern "C" void backend_add(float *out, const float *a, const float *b, size_t n)
{
    order_host(out, n * sizeof *out), order_host(a, n * sizeof *a), order_host(b, n * sizeof *b);
    add_kernel<float><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(out, a, b, n);
}

/* out [A] = a [A] + b [A], added in fp32, rounded once. */
template <typename A> __global__ static void add_act_kernel(A *out, const A *a, const A *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(out, i, ld(a, i) + ld(b, i));
}

extern "C" void backend_add_act(float *out, const float *a, const float *b, size_t n)
{
    WITH_ACT(add_act_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)a, (const A *)b, n));
}

extern "C" void backend_scale(float *x, float s, size_t n)
{
    order_host(x, n * sizeof *x);
    scale_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(x, s, n);
}

__global__ static void zero_kernel(float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = 0.0f;
}

/* A kernel rather than cudaMemsetAsync: x may be mapped pinned host memory. */
extern "C" void backend_zero(float *x, size_t n)
{
    order_host(x, n * sizeof *x);
    if (n)
        zero_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(x, n);
}

extern "C" void backend_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    order_host(dst, bytes), order_host(src, bytes);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g_stream));
    if (!in_device_arena(dst, bytes) || !in_device_arena(src, bytes))
        stream_wait(); /* host memory: complete on return */
}

extern "C" void backend_copy_async(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    order_host(dst, bytes), order_host(src, bytes);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g_stream));
}

/* ---- rotary position embedding and SwiGLU (Llama) ---------------------------------------------- */

/* Rotate-half rotary embedding in place on the first NH + NKV heads of each (NH + 2 NKV) hs row of x [A]: thread
 * per (row, head, i < hs / 2) rotates the pair (i, i + hs / 2) by the angle of (p, i), p = pos[row] (t without
 * positions); sin_sign -1 rotates back (the backward: the transpose of a rotation is its inverse). */
template <typename A>
__global__ static void rope_kernel(A *x, const float *cos, const float *sin, const int32_t *pos, float sin_sign,
                                   int BT, int T, int heads, int width, int hs)
{
    const int half = hs / 2;
    const size_t n = (size_t)BT * heads * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % half), head = (int)(k / half % heads);
        const size_t bt = k / half / heads;
        const int t = pos ? pos[bt] : (int)(bt % T);
        const size_t at = bt * width + (size_t)head * hs + i;
        const float c = cos[(size_t)t * half + i], s = sin_sign * sin[(size_t)t * half + i];
        const float x0 = ld(x, at), x1 = ld(x, at + half);
        st(x, at, x0 * c - x1 * s);
        st(x, at + half, x1 * c + x0 * s);
    }
}

static void rope(float *x, const float *cos, const float *sin, const int32_t *pos, float sin_sign, int B, int T, int NH,
                 int NKV, int hs)
{
    if (hs % 2)
        fail_input("rotary embedding: head size %d is odd (rotate-half pairs channel i with i + hs/2; use an even "
                   "head size)",
                   hs);
    const size_t n = (size_t)B * T * (NH + NKV) * (hs / 2);
    WITH_ACT(rope_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)x, cos, sin, pos, sin_sign, B * T, T,
                                                                          NH + NKV, (NH + 2 * NKV) * hs, hs));
}

extern "C" void backend_rope_forward(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                                     int NH, int NKV, int hs)
{
    rope(qkv, cos, sin, pos, 1.0f, B, T, NH, NKV, hs);
}

extern "C" void backend_rope_backward(float *dqkv, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                                      int NH, int NKV, int hs)
{
    rope(dqkv, cos, sin, pos, -1.0f, B, T, NH, NKV, hs);
}

__device__ static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out (N, F) = silu(gate) * up, gu (N, 2F) = [gate | up]; one thread per (row, f). */
template <typename A> __global__ static void swiglu_forward_kernel(A *out, const A *gu, int N, int F)
{
    const size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t gate = i / F * 2 * F + i % F;
        const float g = ld(gu, gate);
        st(out, i, g / (1.0f + expf(-g)) * ld(gu, gate + F));
    }
}

/* d gate = dout * up * silu'(gate), silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))); d up = dout * silu(gate). A
 * thread reads both of its inputs before it writes, so dgu may be gu. */
template <typename A> __global__ static void swiglu_backward_kernel(A *dgu, const A *dout, const A *gu, int N, int F)
{
    const size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t gate = i / F * 2 * F + i % F;
        const float g = ld(gu, gate), u = ld(gu, gate + F), dy = ld(dout, i), sg = sigmoid(g);
        st(dgu, gate, dy * u * sg * (1.0f + g * (1.0f - sg)));
        st(dgu, gate + F, dy * g * sg);
    }
}

extern "C" void backend_swiglu_forward(float *out, const float *gu, int N, int F)
{
    WITH_ACT(swiglu_forward_kernel<A><<<blocks_for((size_t)N * F, BLOCK), BLOCK, 0, g_stream>>>((A *)out,
                                                                                                (const A *)gu, N, F));
}

extern "C" void backend_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    WITH_ACT(swiglu_backward_kernel<A><<<blocks_for((size_t)N * F, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)dgu, (const A *)dout, (const A *)gu, N, F));
}

/* ---- LoRA (issue 19) ------------------------------------------------------------------------------ */

/* out (N, C) [A] = drop(x), or out += drop(x) (accumulate): element (n, c) kept, times keep_scale, iff
 * lora_dropout_keeps(d, n, c), else 0; added in fp32, rounded once. The CPU backend's lora_drop, the same mask
 * (backend.h's function on the device) and the same keep_scale (computed on the host as the CPU does). */
template <typename A>
__global__ static void lora_drop_kernel(A *out, const A *x, struct lora_dropout d, float keep_scale, int N, int C,
                                        int accumulate)
{
    const size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = lora_dropout_keeps(&d, i / C, (int)(i % C)) ? ld(x, i) * keep_scale : 0.0f;
        st(out, i, accumulate ? ld(out, i) + v : v);
    }
}

static int lora_drops(const struct lora_dropout *d) { return d && d->p > 0.0f; }

static void lora_drop(float *out, const float *x, const struct lora_dropout *d, int N, int C, int accumulate)
{
    const float keep_scale = 1.0f / (1.0f - d->p);
    WITH_ACT(lora_drop_kernel<A><<<blocks_for((size_t)N * C, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)out, (const A *)x, *d, keep_scale, N, C, accumulate));
}

/* Element i of [A] memory (a layer's columns of t or dt). */
static float *act_at(const float *p, size_t i) { return (float *)((const char *)p + i * dtype_size(g_act)); }

static void lora_check_group(const struct lora_dropout *d, int k)
{
    if (lora_drops(d) && k != 1)
        fail_internal("LoRA dropout with %d layers in one call: each layer has its own mask", k);
}

/* t [A] (N, k r) = drop(x) @ A^T for the k stacked A_j at once, then per layer y_j [A] (rows of ld) += scale t_j
 * @ B_j^T with beta 1, t_j the r columns at j r of rows of k r, the GEMM writing columns [0, OC_j) of each row only
 * (column-major: t^T = op_T(A) x^T, y_j^T += scale op_T(B_j) t_j^T with ldb = k r, ldc = ld). */
extern "C" void backend_lora_forward(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out,
                                     int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r)
{
    lora_check_group(d, k);
    if (N <= 0 || C <= 0 || r <= 0 || k <= 0)
        return;
    if (lora_drops(d)) {
        lora_drop(scratch, x, d, N, C, 0);
        x = scratch;
    }
    const int kr = k * r;
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, kr, N, C, 1.0f, A, C, x, C, 0.0f, t, kr, 0);
    for (int j = 0; j < k; j++)
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, out[j].OC, N, r, scale, out[j].B, r, act_at(t, (size_t)j * r), kr, 1.0f,
             out[j].y, ld, 0);
}

/* Per layer dB_j [G] (OC_j, r) += scale dy_j^T @ t_j and dt_j [A] = scale dy_j @ B_j (the r columns at j r of dt's
 * rows of k r); then over all k r columns dA [G] (k r, C) += dt^T @ drop(x) and dx [A] += dt @ A, through scratch
 * and the mask with dropout (k = 1). */
extern "C" void backend_lora_backward(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                                      const float *A, const struct lora_out *out, int k, int ld, float scale,
                                      const struct lora_dropout *d, int N, int C, int r)
{
    lora_check_group(d, k);
    if (N <= 0 || C <= 0 || r <= 0 || k <= 0)
        return;
    const int kr = k * r;
    for (int j = 0; j < k; j++) {
        const int OC = out[j].OC;
        if (out[j].dB)
            gemm(CUBLAS_OP_N, CUBLAS_OP_T, r, OC, N, scale, act_at(t, (size_t)j * r), kr, out[j].y, ld, 1.0f,
                 out[j].dB, r, 1);
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, r, N, OC, scale, out[j].B, r, out[j].y, ld, 0.0f, act_at(dt, (size_t)j * r), kr,
             0);
    }
    const int drops = lora_drops(d);
    if (dA) {
        if (drops)
            lora_drop(scratch, x, d, N, C, 0);
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, kr, N, 1.0f, drops ? scratch : x, C, dt, kr, 1.0f, dA, C, 1);
    }
    if (!drops) {
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, kr, 1.0f, A, C, dt, kr, 1.0f, dx, C, 0);
        return;
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, r, 1.0f, A, C, dt, r, 0.0f, scratch, C, 0);
    lora_drop(dx, scratch, d, N, C, 1);
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Causal attention without the T x T matrices: FlashAttention-2 (Dao 2023)
 * in tiles staged in shared memory. The forward keeps the output [A] and,
 * per row, the log-sum-exp of its scores (fp32, att: B NH T floats); the
 * backward recomputes each probability from q, k and that statistic.
 *
 * A block is ATT_ROWS rows (queries in the forward and dq, keys in dk/dv) of
 * one head of one sequence, ATT_LANES threads a row, each lane holding the
 * channels lane, lane + ATT_LANES, ... of its row's vectors in registers (F
 * of them, a template argument: 16, 32 or 64 for head sizes up to 64, 128
 * or 256, so that the loops unroll; on sm_90 no spills up to 128); a score
 * is the lanes' partial dot products summed by two shuffles. The other
 * side (keys and values, or queries and output gradients) streams through
 * shared memory in tiles of att_tile_rows rows, converted to fp32 once
 * and read by every row of the block. The softmax is fp32 with a running
 * maximum (the online softmax) in the forward; no atomics, a fixed order:
 * dq by query blocks over key tiles, dk and dv by key blocks over the group's
 * query heads in order and their query tiles, so the results do not depend
 * on scheduling. Grouped-query attention (Llama): NH query heads share NKV
 * key/value heads, query head h reading kv head h / (NH / NKV); GPT-2 is NKV
 * = NH. Head size at most ATT_MAX_HS.
 *
 * Skipped, not computed and masked: key tiles after a query block's last row
 * (above the diagonal) and, in packed rows (pos, backend.h), before its first
 * row's sample; query tiles before a key block's first key and after its
 * last key's sample. Every tile visited holds at least one pair that is
 * computed; pairs of a visited tile across the diagonal or a sample boundary
 * are masked one by one. So a row of samples of lengths n_k costs about
 * sum n_k^2 / 2, not T^2. */
#define ATT_MAX_HS 256
#define ATT_ROWS 32                        /* rows of a block */
#define ATT_LANES 4                        /* threads per row */
#define ATT_THREADS (ATT_ROWS * ATT_LANES) /* per block */
#define ATT_TILE_FLOATS 4096               /* one staged tile (16 KiB); two per block */
#define ATT_MAX_TILE 64                    /* rows of a staged tile, at most */

struct att_shape {
    int B, T, NH, NKV, hs;
    int group; /* query heads per kv head, NH / NKV */
    float scale;
    const int32_t *pos; /* (B, T) each token's position in its sample, or NULL: one sample per row */
};

__device__ static int att_min(int x, int y) { return x < y ? x : y; }

/* Rows of a staged tile of w floats a row (the head size padded to the lanes' fragments): as many as
 * ATT_TILE_FLOATS holds, at most ATT_MAX_TILE (64 at hs <= 64, 32 at 128, 16 at 256). */
__device__ static int att_tile_rows(int w)
{
    return ATT_TILE_FLOATS / w < ATT_MAX_TILE ? ATT_TILE_FLOATS / w : ATT_MAX_TILE;
}

/* The first key that query t of sequence b sees: its sample's first token (0 without positions). */
__device__ static int att_first_key(const struct att_shape &s, int b, int t)
{
    return s.pos ? t - s.pos[(size_t)b * s.T + t] : 0;
}

/* One past the last query that sees key j of sequence b: the next sample's first token (T without positions). */
__device__ static int att_query_end(const struct att_shape &s, int b, int j)
{
    if (!s.pos)
        return s.T;
    const int32_t *p = s.pos + (size_t)b * s.T;
    int i = j + 1;
    while (i < s.T && p[i] != 0)
        i++;
    return i;
}

/* Row t of sequence b in the (B, T, (NH + 2 NKV) hs) qkv: query head h (part 0), key head h (part 1) or value
 * head h (part 2). */
template <typename P> __device__ static P *att_row(P *qkv, const struct att_shape &s, int b, int t, int h, int part)
{
    const int head = part == 0 ? h : part == 1 ? s.NH + h : s.NH + s.NKV + h;
    return qkv + ((size_t)b * s.T + t) * (size_t)(s.NH + 2 * s.NKV) * s.hs + (size_t)head * s.hs;
}

/* Row t of query head h of sequence b in a (B, T, NH hs) tensor (out, dout). */
template <typename A> __device__ static A *att_out_row(A *x, const struct att_shape &s, int b, int t, int h)
{
    return x + ((size_t)b * s.T + t) * (size_t)s.NH * s.hs + (size_t)h * s.hs;
}

/* Where the log-sum-exp of row i of query head h of sequence b is in lse (B, NH, T). */
__device__ static size_t att_lse_at(const struct att_shape &s, int b, int h, int i)
{
    return ((size_t)b * s.NH + h) * s.T + i;
}

/* This thread's place: its block's sequence and head (grid x: B heads, heads NH or NKV), its block's first row,
 * its own row clamped to the last one (rows past T compute on it, so that every lane takes part in the
 * shuffles and barriers, and store nothing), and its lane. */
struct att_thread {
    int b, h, r0, row, lane;
    bool valid; /* the thread's row is < T */
};

__device__ static struct att_thread att_thread_of(const struct att_shape &s, int heads)
{
    struct att_thread t;
    t.b = blockIdx.x / heads;
    t.h = blockIdx.x % heads;
    t.r0 = blockIdx.y * ATT_ROWS;
    const int row = t.r0 + (int)threadIdx.x / ATT_LANES;
    t.valid = row < s.T;
    t.row = t.valid ? row : s.T - 1;
    t.lane = (int)threadIdx.x % ATT_LANES;
    return t;
}

/* A lane's channels of a row, F of them at most (a compile-time bound, so that fragments live in registers):
 * f[k] = x[lane + k ATT_LANES] (fp32), scaled; 0 past hs. */
template <int F, typename A> __device__ static void att_frag_load(float *f, const A *x, int lane, int hs, float scale)
{
#pragma unroll
    for (int k = 0; k < F; k++) {
        const int c = lane + k * ATT_LANES;
        f[k] = c < hs ? ld(x, c) * scale : 0.0f;
    }
}

template <int F, typename A> __device__ static void att_frag_store(A *x, const float *f, int lane, int hs, float scale)
{
#pragma unroll
    for (int k = 0; k < F; k++) {
        const int c = lane + k * ATT_LANES;
        if (c < hs)
            st(x, c, f[k] * scale);
    }
}

template <int F> __device__ static void att_frag_zero(float *f)
{
#pragma unroll
    for (int k = 0; k < F; k++)
        f[k] = 0.0f;
}

/* The lanes' partial sums added over the ATT_LANES lanes of a row (neighbours in one warp) by shuffles; every
 * lane gets the sum. */
__device__ static float att_lanes_sum(float d)
{
#pragma unroll
    for (int o = 1; o < ATT_LANES; o *= 2)
        d += __shfl_xor_sync(0xffffffffu, d, o);
    return d;
}

/* The dot product of a row held in fragments by its lanes with a row x of shared memory (hs floats, a lane
 * reading only its channels; x is padded with zeros to ATT_LANES F channels by att_stage, so no bound check). */
template <int F> __device__ static float att_dot(const float *f, const float *x, int lane)
{
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < F; k++)
        d += f[k] * x[lane + k * ATT_LANES];
    return att_lanes_sum(d);
}

/* f += w x, over a lane's channels of a shared-memory row x (padded as above). */
template <int F> __device__ static void att_axpy(float *f, float w, const float *x, int lane)
{
#pragma unroll
    for (int k = 0; k < F; k++)
        f[k] += w * x[lane + k * ATT_LANES];
}

/* n rows of hs [A] elements, row j at first + j stride, into shared memory xs (n rows of w = ATT_LANES F
 * floats, the channels past hs zero), by the whole block. */
template <int F, typename A>
__device__ static void att_stage(float *xs, const A *first, size_t stride, int n, int hs)
{
    const int w = ATT_LANES * F;
    for (int e = (int)threadIdx.x; e < n * w; e += ATT_THREADS) {
        const int c = e % w;
        xs[e] = c < hs ? ld(first + (size_t)(e / w) * stride, c) : 0.0f;
    }
}

/* Queries of one block against the keys from its first row's first key to its last row, in staged tiles of
 * keys and values; each row's scores of a tile in shared memory (written by its first lane), its running
 * maximum m and sum l, its output in acc. */
template <typename A, int F>
__global__ static void __launch_bounds__(ATT_THREADS) attention_forward_kernel(A *out, float *lse, const A *qkv,
                                                                                struct att_shape s)
{
    __shared__ float ks[ATT_TILE_FLOATS], vs[ATT_TILE_FLOATS], scores[ATT_ROWS][ATT_MAX_TILE];
    const struct att_thread t = att_thread_of(s, s.NH);
    const int kvh = t.h / s.group, hs = s.hs, w = ATT_LANES * F, tile = att_tile_rows(w), r = t.row - t.r0;
    const int last = att_min(t.r0 + ATT_ROWS, s.T) - 1, first = att_first_key(s, t.b, t.row);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs;
    float q[F], acc[F];
    att_frag_load<F>(q, att_row(qkv, s, t.b, t.row, t.h, 0), t.lane, hs, s.scale);
    att_frag_zero<F>(acc);
    float m = -INFINITY, l = 0.0f;
    for (int j0 = att_first_key(s, t.b, t.r0); j0 <= last; j0 += tile) {
        const int n = att_min(tile, last + 1 - j0);
        att_stage<F>(ks, att_row(qkv, s, t.b, j0, kvh, 1), stride, n, hs);
        att_stage<F>(vs, att_row(qkv, s, t.b, j0, kvh, 2), stride, n, hs);
        __syncthreads();
        float mx = m;
        for (int c = 0; c < n; c++) {
            const int j = j0 + c;
            const float dot = att_dot<F>(q, ks + (size_t)c * w, t.lane); /* every lane: a shuffle */
            const float x = j < first || j > t.row ? -INFINITY : dot;
            if (t.lane == 0)
                scores[r][c] = x;
            mx = fmaxf(mx, x);
        }
        __syncwarp();
        if (mx > -INFINITY) { /* else no key of this tile is the row's: nothing changes */
            const float correction = expf(m - mx); /* 0 while m is -inf: acc and l are still 0 */
            l *= correction;
#pragma unroll
            for (int k = 0; k < F; k++)
                acc[k] *= correction;
            for (int c = 0; c < n; c++)
                if (scores[r][c] > -INFINITY) {
                    const float p = expf(scores[r][c] - mx);
                    l += p;
                    att_axpy<F>(acc, p, vs + (size_t)c * w, t.lane);
                }
            m = mx;
        }
        __syncthreads();
    }
    if (!t.valid)
        return;
    att_frag_store<F>(att_out_row(out, s, t.b, t.row, t.h), acc, t.lane, hs, 1.0f / l);
    if (t.lane == 0)
        lse[att_lse_at(s, t.b, t.h, t.row)] = m + logf(l);
}

/* D_i = dout_i . out_i, the softmax backward's row term (out = P v, so sum_j P_ij dP_ij), of the row whose
 * output gradient the lanes hold in dy. */
template <int F, typename A> __device__ static float att_row_term(const float *dy, const A *out_row, int lane, int hs)
{
    float y[F];
    att_frag_load<F>(y, out_row, lane, hs, 1.0f);
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < F; k++)
        d += dy[k] * y[k];
    return att_lanes_sum(d);
}

/* dq_i = scale sum_{first key <= j <= i} P_ij (dP_ij - D_i) k_j, dP_ij = dout_i . v_j: a block of queries over
 * the tiles of keys and values the forward visited. */
template <typename A, int F>
__global__ static void __launch_bounds__(ATT_THREADS) attention_backward_dq(A *dqkv, const A *dout, const A *out,
                                                                             const A *qkv, const float *lse,
                                                                             struct att_shape s)
{
    __shared__ float ks[ATT_TILE_FLOATS], vs[ATT_TILE_FLOATS];
    const struct att_thread t = att_thread_of(s, s.NH);
    const int kvh = t.h / s.group, hs = s.hs, w = ATT_LANES * F, tile = att_tile_rows(w);
    const int last = att_min(t.r0 + ATT_ROWS, s.T) - 1, first = att_first_key(s, t.b, t.row);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs;
    float q[F], dy[F], acc[F];
    att_frag_load<F>(q, att_row(qkv, s, t.b, t.row, t.h, 0), t.lane, hs, 1.0f);
    att_frag_load<F>(dy, att_out_row(dout, s, t.b, t.row, t.h), t.lane, hs, 1.0f);
    att_frag_zero<F>(acc);
    const float L = lse[att_lse_at(s, t.b, t.h, t.row)];
    const float D = att_row_term<F>(dy, att_out_row(out, s, t.b, t.row, t.h), t.lane, hs);
    for (int j0 = att_first_key(s, t.b, t.r0); j0 <= last; j0 += tile) {
        const int n = att_min(tile, last + 1 - j0);
        att_stage<F>(ks, att_row(qkv, s, t.b, j0, kvh, 1), stride, n, hs);
        att_stage<F>(vs, att_row(qkv, s, t.b, j0, kvh, 2), stride, n, hs);
        __syncthreads();
        for (int c = 0; c < n; c++) {
            const float x = att_dot<F>(q, ks + (size_t)c * w, t.lane) * s.scale;
            const float dp = att_dot<F>(dy, vs + (size_t)c * w, t.lane);
            const int j = j0 + c;
            if (j >= first && j <= t.row)
                att_axpy<F>(acc, expf(x - L) * (dp - D) * s.scale, ks + (size_t)c * w, t.lane);
        }
        __syncthreads();
    }
    if (t.valid)
        att_frag_store<F>(att_row(dqkv, s, t.b, t.row, t.h, 0), acc, t.lane, hs, 1.0f);
}

/* For kv head g: dk_j = scale sum_{h in g's group} sum_{j <= i < query end} P^h_ij (dP^h_ij - D^h_i) q^h_i;
 * dv_j = sum_h sum_{j <= i < query end} P^h_ij dout^h_i. A block of keys over the group's query heads in order,
 * for each the tiles of queries (with their output gradients, log-sum-exp, row term and first key) from the
 * block's first key to the end of its last key's sample. */
template <typename A, int F>
__global__ static void __launch_bounds__(ATT_THREADS) attention_backward_dkdv(A *dqkv, const A *dout, const A *out,
                                                                               const A *qkv, const float *lse,
                                                                               struct att_shape s)
{
    __shared__ float qs[ATT_TILE_FLOATS], dys[ATT_TILE_FLOATS];
    __shared__ float Ls[ATT_MAX_TILE], Ds[ATT_MAX_TILE];
    __shared__ int firsts[ATT_MAX_TILE];
    const struct att_thread t = att_thread_of(s, s.NKV);
    const int g = t.h, j = t.row, hs = s.hs, w = ATT_LANES * F, tile = att_tile_rows(w);
    const int end = att_query_end(s, t.b, att_min(t.r0 + ATT_ROWS, s.T) - 1);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs, out_stride = (size_t)s.NH * hs;
    float k[F], v[F], dk[F], dv[F];
    att_frag_load<F>(k, att_row(qkv, s, t.b, j, g, 1), t.lane, hs, 1.0f);
    att_frag_load<F>(v, att_row(qkv, s, t.b, j, g, 2), t.lane, hs, 1.0f);
    att_frag_zero<F>(dk);
    att_frag_zero<F>(dv);
    for (int h = g * s.group; h < (g + 1) * s.group; h++)
        for (int i0 = t.r0; i0 < end; i0 += tile) {
            const int n = att_min(tile, end - i0);
            att_stage<F>(qs, att_row(qkv, s, t.b, i0, h, 0), stride, n, hs);
            att_stage<F>(dys, att_out_row(dout, s, t.b, i0, h), out_stride, n, hs);
            __syncthreads();
            /* the tile's row terms, ATT_ROWS rows at a time, a row's lanes together as in the forward */
            for (int c0 = 0; c0 < n; c0 += ATT_ROWS) {
                const int c = att_min(c0 + (int)threadIdx.x / ATT_LANES, n - 1), i = i0 + c;
                const A *y = att_out_row(out, s, t.b, i, h);
                float d = 0.0f; /* dout_i (staged) . out_i */
                for (int ch = t.lane; ch < hs; ch += ATT_LANES)
                    d += dys[(size_t)c * w + ch] * ld(y, ch);
                d = att_lanes_sum(d);
                if (c0 + (int)threadIdx.x / ATT_LANES < n && t.lane == 0) {
                    Ds[c] = d;
                    Ls[c] = lse[att_lse_at(s, t.b, h, i)];
                    firsts[c] = att_first_key(s, t.b, i);
                }
            }
            __syncthreads();
            for (int c = 0; c < n; c++) {
                const float x = att_dot<F>(k, qs + (size_t)c * w, t.lane) * s.scale;
                const float dp = att_dot<F>(v, dys + (size_t)c * w, t.lane);
                const int i = i0 + c;
                if (j <= i && firsts[c] <= j) {
                    const float p = expf(x - Ls[c]);
                    att_axpy<F>(dv, p, dys + (size_t)c * w, t.lane);
                    att_axpy<F>(dk, p * (dp - Ds[c]) * s.scale, qs + (size_t)c * w, t.lane);
                }
            }
            __syncthreads();
        }
    if (!t.valid)
        return;
    att_frag_store<F>(att_row(dqkv, s, t.b, j, g, 1), dk, t.lane, hs, 1.0f);
    att_frag_store<F>(att_row(dqkv, s, t.b, j, g, 2), dv, t.lane, hs, 1.0f);
}

/* Runs `body` with F bound to the channels per lane the kernels are built for that hold head size hs. */
#define WITH_ATT_FRAG(hs, ...)                            \
    do {                                                  \
        if ((hs) <= 16 * ATT_LANES) {                     \
            constexpr int F = 16;                         \
            __VA_ARGS__;                                  \
        } else if ((hs) <= 32 * ATT_LANES) {              \
            constexpr int F = 32;                         \
            __VA_ARGS__;                                  \
        } else {                                          \
            constexpr int F = ATT_MAX_HS / ATT_LANES;     \
            __VA_ARGS__;                                  \
        }                                                 \
    } while (0)

static struct att_shape att_shape_of(const int32_t *pos, int B, int T, int NH, int NKV, int hs)
{
    if (NKV < 1 || NH % NKV != 0)
        fail_input("attention: %d key/value heads do not divide %d query heads (model.n_kv_head must divide "
                   "model.n_head)",
                   NKV, NH);
    if (hs > ATT_MAX_HS)
        fail_input("attention: head size %d is more than the %d this CUDA kernel supports (a smaller head size: "
                   "more heads for the same width)",
                   hs, ATT_MAX_HS);
    struct att_shape s = {B, T, NH, NKV, hs, NH / NKV, 1.0f / sqrtf((float)hs), pos};
    return s;
}

/* att: the rows' log-sum-exp (B NH T fp32), kept for the backward. */
extern "C" void backend_attention_gqa_forward(float *out, float *att, const float *qkv, float *scratch,
                                              const int32_t *pos, int B, int T, int NH, int NKV, int hs)
{
    (void)scratch;
    const struct att_shape s = att_shape_of(pos, B, T, NH, NKV, hs);
    if (attention_tc_forward(out, att, qkv, pos, B, T, NH, NKV, hs, g_act, g_stream)) /* tensor cores */
        return;
    const dim3 grid((unsigned)(B * NH), (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS));
    WITH_ACT(WITH_ATT_FRAG(hs, attention_forward_kernel<A, F><<<grid, ATT_THREADS, 0, g_stream>>>((A *)out, att,
                                                                                                 (const A *)qkv, s)));
}

/* out: the forward's output (backend.h: the attention's output is kept). */
extern "C" void backend_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                               const float *out, float *scratch, const int32_t *pos, int B, int T,
                                               int NH, int NKV, int hs)
{
    (void)scratch;
    const struct att_shape s = att_shape_of(pos, B, T, NH, NKV, hs);
    if (attention_tc_backward(dqkv, dout, out, qkv, att, pos, B, T, NH, NKV, hs, g_act, g_stream)) /* tensor cores */
        return;
    const unsigned row_blocks = (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS);
    const dim3 q_grid((unsigned)(B * NH), row_blocks), kv_grid((unsigned)(B * NKV), row_blocks);
    WITH_ACT(WITH_ATT_FRAG(hs, {
        attention_backward_dq<A, F><<<q_grid, ATT_THREADS, 0, g_stream>>>((A *)dqkv, (const A *)dout, (const A *)out,
                                                                       (const A *)qkv, att, s);
        attention_backward_dkdv<A, F><<<kv_grid, ATT_THREADS, 0, g_stream>>>(
            (A *)dqkv, (const A *)dout, (const A *)out, (const A *)qkv, att, s);
    }));
}

/* GPT-2: NKV = NH heads of C / NH channels. */
extern "C" void backend_attention_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                          int B, int T, int C, int NH)
{
    backend_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NH, C / NH);
}

extern "C" void backend_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                           const float *out, float *scratch, const int32_t *pos, int B, int T, int C,
                                           int NH)
{
    backend_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NH, C / NH);
}

extern "C" size_t backend_attention_saved(int B, int T, int NH) { return BACKEND_CUDA_ATTENTION_SAVED(B, T, NH); }

extern "C" size_t backend_attention_scratch(int T, int NH) { return BACKEND_CUDA_ATTENTION_SCRATCH(T, NH); }

extern "C" size_t backend_library_workspace(void) { return BACKEND_CUDA_LIBRARY_WORKSPACE; }

extern "C" void backend_set_library_workspace(void *p, size_t bytes)
{
    cublasCheck(cublasSetWorkspace(g_cublas, p, bytes));
    g_workspace = p;
    g_workspace_bytes = bytes;
}

/* ---- embedding ------------------------------------------------------------------------------- */

template <typename A>
__global__ static void embedding_forward_kernel(A *out, const int32_t *tokens, const A *wte, const A *wpe,
                                                const int32_t *pos, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = pos ? pos[bt] : (int)(bt % T);
        const float e = ld(wte, (size_t)tokens[bt] * C + c);
        st(out, i, wpe ? e + ld(wpe, (size_t)t * C + c) : e);
    }
}

/* dwpe[t][c] += sum over b of dout[b][t][c], b in order; one thread per (t, c). */
__global__ static void embedding_backward_wpe(void *dwpe, enum dtype dt, const void *dout, enum dtype act, int B,
                                              int T, int C)
{
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++)
            s += load_as_f32(dout, act, (size_t)b * n + i);
        store_from_f32(dwpe, dt, i, load_as_f32(dwpe, dt, i) + s);
    }
}

/* dst[rows[bt]][c] += dout[bt][c0 + c] for c < width, bt in order: the token
 * embedding's gradient (rows = tokens, dst = dwte, the whole width) and the
 * sums of packed rows' positions (rows = pos, dst a (T, width) fp32 window).
 * dst has ld elements a row. Thread (c, part) owns the rows with row % parts
 * == part, so every row is added to by one thread, in token order: a fixed
 * order, no atomics, parts x width threads at work. */
#define WTE_PARTS 64
__global__ static void embedding_backward_rows(void *dst, enum dtype dt, int ld, const void *dout, enum dtype act,
                                               const int32_t *rows, int BT, int C, int c0, int width)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, part = blockIdx.y;
    if (c >= width)
        return;
    for (int bt = 0; bt < BT; bt++) {
        int r = rows[bt];
        if (r % WTE_PARTS == part) {
            size_t i = (size_t)r * ld + c;
            store_from_f32(dst, dt, i, load_as_f32(dst, dt, i) + load_as_f32(dout, act, (size_t)bt * C + c0 + c));
        }
    }
}

/* dwpe[p][c0 + c] += sums[p][c] for p < T, c < width: one rounding per element. */
__global__ static void embedding_backward_wpe_finish(void *dwpe, enum dtype dt, const float *sums, int T, int C,
                                                     int c0, int width)
{
    size_t n = (size_t)T * width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = i / width * C + c0 + i % width;
        store_from_f32(dwpe, dt, at, load_as_f32(dwpe, dt, at) + sums[i]);
    }
}

/* dwpe[pos[bt]] += dout[bt] for packed rows: summed in fp32 in token order in
 * g_colsum, as many columns at a time as T rows of them fit, then added into
 * dwpe once, as the per-position sums of embedding_backward_wpe are. */
static void embedding_backward_wpe_packed(float *dwpe, const float *dout, const int32_t *pos, int B, int T, int C)
{
    if ((size_t)T > COLSUM_FLOATS)
        fail_internal("a sequence of %d tokens exceeds the %zu-float column-sum buffer", T, (size_t)COLSUM_FLOATS);
    const int window = (int)(COLSUM_FLOATS / (size_t)T) < C ? (int)(COLSUM_FLOATS / (size_t)T) : C;
    for (int c0 = 0; c0 < C; c0 += window) {
        const int width = C - c0 < window ? C - c0 : window;
        const size_t n = (size_t)T * width;
        zero_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(g_colsum, n);
        dim3 grid((width + BLOCK - 1) / BLOCK, WTE_PARTS);
        embedding_backward_rows<<<grid, BLOCK, 0, g_stream>>>(g_colsum, DTYPE_F32, width, dout, g_act, pos, B * T, C,
                                                             c0, width);
        embedding_backward_wpe_finish<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(dwpe, g_grad, g_colsum, T, C, c0,
                                                                                    width);
    }
}

extern "C" void backend_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                          const int32_t *pos, int B, int T, int C)
{
    WITH_ACT(embedding_forward_kernel<A><<<blocks_for((size_t)B * T * C, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)out, tokens, (const A *)wte, (const A *)wpe, pos, B, T, C));
}

extern "C" void backend_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                           const int32_t *pos, int B, int T, int C)
{
    if (dwpe && pos)
        embedding_backward_wpe_packed(dwpe, dout, pos, B, T, C);
    else if (dwpe)
        embedding_backward_wpe<<<blocks_for((size_t)T * C, BLOCK), BLOCK, 0, g_stream>>>(dwpe, g_grad, dout, g_act, B,
                                                                                         T, C);
    dim3 grid((C + BLOCK - 1) / BLOCK, WTE_PARTS);
    embedding_backward_rows<<<grid, BLOCK, 0, g_stream>>>(dwte, g_grad, C, dout, g_act, tokens, B * T, C, 0, C);
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

__device__ static float block_reduce(float v, bool take_max)
{
    __shared__ float shared[BLOCK / WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int o = WARP / 2; o > 0; o /= 2) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = take_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = take_max ? -INFINITY : 0.0f;
    for (int w = 0; w < BLOCK / WARP; w++)
        v = take_max ? fmaxf(v, shared[w]) : v + shared[w];
    return v;
}

/* ---- attention with a key/value cache (generation) ------------------------------------------------ */

/* The new tokens' keys and values into the cache at their rows' positions. */
template <typename A>
__global__ static void kv_store_kernel(A *kc, A *vc, const A *qkv, const int32_t *past, int B, int T, int NH, int NKV,
                                       int hs, int Tmax)
{
    const size_t kvw = (size_t)NKV * hs, row = (size_t)(NH + 2 * NKV) * hs, n = (size_t)B * T * kvw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t tok = i / kvw, c = i % kvw;
        const int b = (int)(tok / T), t = (int)(tok % T);
        const size_t at = ((size_t)b * Tmax + (size_t)(past[b] + t)) * kvw + c;
        kc[at] = qkv[tok * row + (size_t)NH * hs + c];
        vc[at] = qkv[tok * row + (size_t)NH * hs + kvw + c];
    }
}

/* Head sizes the cached attention takes (Llama and GPT-2 models have 64 or 128). */
#define KV_MAX_HS 256

/* One block (BLOCK threads) per (token, query head): the keys of its row up
 * to its position in chunks of BLOCK, one score per thread, with the online
 * softmax (running maximum and sum, the accumulated values rescaled). Shared:
 * q and the accumulator (hs each), the chunk's weights (BLOCK). */
template <typename A>
__global__ static void kv_attention_kernel(A *out, const A *qkv, const A *kc, const A *vc, const int32_t *past, int T,
                                           int NH, int NKV, int hs, int Tmax, float scale)
{
    __shared__ float q[KV_MAX_HS], acc[KV_MAX_HS], w[BLOCK];
    const int tok = blockIdx.x / NH, h = blockIdx.x % NH, b = tok / T, t = tok % T;
    const size_t kvw = (size_t)NKV * hs, row = (size_t)(NH + 2 * NKV) * hs;
    for (int i = threadIdx.x; i < hs; i += blockDim.x) {
        q[i] = ld(qkv, (size_t)tok * row + (size_t)h * hs + i);
        acc[i] = 0.0f;
    }
    __syncthreads();
    const A *k = kc + (size_t)b * Tmax * kvw + (size_t)(h / (NH / NKV)) * hs;
    const A *v = vc + (size_t)b * Tmax * kvw + (size_t)(h / (NH / NKV)) * hs;
    const int n = past[b] + t + 1;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        const int j = j0 + threadIdx.x, cnt = n - j0 < (int)blockDim.x ? n - j0 : (int)blockDim.x;
        float s = -INFINITY;
        if (j < n) {
            s = 0.0f;
            for (int i = 0; i < hs; i++)
                s += q[i] * ld(k, (size_t)j * kvw + i);
            s *= scale;
        }
        const float m_new = fmaxf(m, block_reduce(s, true));
        const float e = j < n ? expf(s - m_new) : 0.0f;
        w[threadIdx.x] = e;
        const float chunk = block_reduce(e, false), corr = expf(m - m_new);
        __syncthreads();
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            float a = acc[i] * corr;
            for (int jj = 0; jj < cnt; jj++)
                a += w[jj] * ld(v, (size_t)(j0 + jj) * kvw + i);
            acc[i] = a;
        }
        l = l * corr + chunk;
        m = m_new;
        __syncthreads();
    }
    for (int i = threadIdx.x; i < hs; i += blockDim.x)
        st(out, (size_t)tok * NH * hs + (size_t)h * hs + i, acc[i] / l);
}

extern "C" void backend_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                             int B, int T, int NH, int NKV, int hs, int Tmax)
{
    if (hs > KV_MAX_HS)
        fail_internal("attention with a cache: head size %d, above the %d the kernel holds", hs, KV_MAX_HS);
    const float scale = 1.0f / sqrtf((float)hs);
    WITH_ACT({
        kv_store_kernel<A><<<blocks_for((size_t)B * T * NKV * hs, BLOCK), BLOCK, 0, g_stream>>>(
            (A *)kc, (A *)vc, (const A *)qkv, past, B, T, NH, NKV, hs, Tmax);
        kv_attention_kernel<A><<<(unsigned)(B * T * NH), BLOCK, 0, g_stream>>>(
            (A *)out, (const A *)qkv, (const A *)kc, (const A *)vc, past, T, NH, NKV, hs, Tmax, scale);
    });
}

/* One block per row: softmax over the first V logits in fp32, padded columns 0. */
template <typename A>
__global__ static void crossentropy_forward_kernel(float *losses, A *logits, const int32_t *targets, int V, int Vp)
{
    A *x = logits + (size_t)blockIdx.x * Vp;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, ld(x, j));
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(ld(x, j) - m);
    s = block_reduce(s, false);
    const int target = targets[blockIdx.x];
    if (threadIdx.x == 0) /* -log p[target] = log sum exp - logit[target], before x is overwritten; 0 when ignored */
        losses[blockIdx.x] = target >= 0 ? logf(s) + m - ld(x, target) : 0.0f;
    __syncthreads();
    for (int j = threadIdx.x; j < Vp; j += blockDim.x)
        st(x, j, j < V ? expf(ld(x, j) - m) / s : 0.0f);
}

template <typename A>
__global__ static void crossentropy_backward_kernel(A *probs, const int32_t *targets, float dloss, int V, int Vp)
{
    A *p = probs + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) /* an ignored target (< 0): the whole row 0 */
        st(p, j, j < V && target >= 0 ? (ld(p, j) - (j == target ? 1.0f : 0.0f)) * dloss : 0.0f);
}

extern "C" void backend_crossentropy_forward(float *losses, float *logits, const int32_t *targets, int N, int V,
                                             int Vp)
{
    WITH_ACT(crossentropy_forward_kernel<A><<<N, BLOCK, 0, g_stream>>>(losses, (A *)logits, targets, V, Vp));
}

extern "C" void backend_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp)
{
    WITH_ACT(crossentropy_backward_kernel<A><<<N, BLOCK, 0, g_stream>>>((A *)probs, targets, dloss, V, Vp));
}

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

__device__ static void store_from_f32(void *dst, enum dtype dt, size_t i, float v);

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

/* ---- memory spaces and casts ------------------------------------------------------------------- */

extern "C" void *backend_mem_alloc(enum mem_space space, size_t bytes, const char *what)
{
    void *p = NULL;
    cudaError_t e = cudaSuccess;
    size_t n = bytes ? bytes : 1;
    if (space == SPACE_DEVICE)
        e = cudaMalloc(&p, n);
    else if (space == SPACE_PINNED) /* mapped: kernels address it with the host pointer (UVA) */
        e = cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable);
    else if (posix_memalign(&p, 4096, n) != 0)
        p = NULL;
    if (e != cudaSuccess || !p) {
        char b[32], f[32];
        size_t free_bytes = 0, total = 0;
        if (space == SPACE_DEVICE)
            cudaMemGetInfo(&free_bytes, &total);
        (void)cudaGetLastError(); /* an allocation failure is not sticky; clear it */
        fail_input("out of %s memory allocating %s for %s%s%s; shrink the plan (`shardlm plan` shows it)",
                   arena_space_name(space), format_bytes((double)bytes, b, sizeof b), what,
                   space == SPACE_DEVICE ? ", the GPU has free " : "",
                   space == SPACE_DEVICE ? format_bytes((double)free_bytes, f, sizeof f) : "");
    }
    if (space == SPACE_DEVICE) { /* on the kernels' stream: a non-blocking stream does not wait for the default one */
        cudaCheck(cudaMemsetAsync(p, 0, n, g_stream));
        if (g_n_device_ranges < MAX_DEVICE_RANGES) /* an unlisted range only costs copies a wait */
            g_device_ranges[g_n_device_ranges].base = (const char *)p, g_device_ranges[g_n_device_ranges++].bytes = n;
    } else
        memset(p, 0, n);
    return p;
}

extern "C" void backend_mem_free(enum mem_space space, void *p, size_t bytes)
{
    (void)bytes;
    if (!p)
        return;
    if (space == SPACE_DEVICE) {
        for (int i = 0; i < g_n_device_ranges; i++)
            if (g_device_ranges[i].base == p)
                g_device_ranges[i] = g_device_ranges[--g_n_device_ranges];
        cudaCheck(cudaFree(p));
    } else if (space == SPACE_PINNED)
        cudaCheck(cudaFreeHost(p));
    else
        free(p);
}

extern "C" int backend_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
}

__device__ static float load_as_f32(const void *src, enum dtype dt, size_t i)
{
    if (dt == DTYPE_F16)
        return __half2float(((const __half *)src)[i]);
    if (dt == DTYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
    return ((const float *)src)[i];
}

/* Round to nearest even, as dtype.h does on the host. */
__device__ static void store_from_f32(void *dst, enum dtype dt, size_t i, float v)
{
    if (dt == DTYPE_F16)
        ((__half *)dst)[i] = __float2half_rn(v);
    else if (dt == DTYPE_BF16)
        ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
    else
        ((float *)dst)[i] = v;
}

__global__ static void convert_kernel(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        store_from_f32(dst, dst_dt, i, load_as_f32(src, src_dt, i));
}

__global__ static void add_to_f32_kernel(float *acc, const void *src, enum dtype dt, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] += load_as_f32(src, dt, i);
}

extern "C" void backend_convert(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n)
{
    if (!n)
        return;
    cudaStream_t s = transfer_stream(dst, n * dtype_size(dst_dt), src, n * dtype_size(src_dt));
    convert_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, s>>>(dst, dst_dt, src, src_dt, n);
    copy_issued(s);
}

extern "C" void backend_add_to_f32(float *acc, const void *src, enum dtype dt, size_t n)
{
    if (!n)
        return;
    cudaStream_t s = transfer_stream(acc, n * sizeof *acc, src, n * dtype_size(dt));
    add_to_f32_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, s>>>(acc, src, dt, n);
    copy_issued(s);
}

extern "C" void backend_synchronize(void) { stream_wait(); }

extern "C" void backend_cuda_set_watchdog(const char *(*check)(void)) { g_watchdog = check; }

extern "C" cudaStream_t backend_cuda_stream(void) { return g_stream; }

/* The copy stream's last transfer while the compute stream has not waited for
 * it, else NULL: comm_nccl's stream waits for it before its next collective,
 * whose output may be a pending transfer's source. */
extern "C" cudaEvent_t backend_cuda_copy_event(void) { return g_copy_pending ? g_copy_done : NULL; }
