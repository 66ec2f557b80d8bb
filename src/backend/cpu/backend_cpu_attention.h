/*
 * backend_cpu_attention — which of the CPU backend's two attention kernels
 * runs (backend_cpu_attention.c has both):
 *   tiled         (the default) FlashAttention-2: keeps the output and each
 *                 row's log-sum-exp (B, NH, T) fp32, as the CUDA backend does,
 *                 and recomputes the probabilities in the backward; scratch
 *                 of a few tiles per thread, nothing T x T;
 *   materialized  keeps the probabilities (B, NH, T, T) [A]; a T x T scratch
 *                 per thread. Kept for comparing the two (issue 21's benchmark).
 * SHARDLM_ATTENTION=tiled|materialized chooses, read at the first call that
 * needs it (anything else is an error). backend_attention_saved and
 * backend_attention_scratch follow the choice, and so does the memory plan;
 * the choice must therefore not change between sizing buffers and using them.
 * backend_cpu_attention_use sets it from the code (tests, benchmarks).
 */
#ifndef SHARDLM_BACKEND_CPU_ATTENTION_H
#define SHARDLM_BACKEND_CPU_ATTENTION_H

enum cpu_attention { CPU_ATTENTION_TILED, CPU_ATTENTION_MATERIALIZED };

enum cpu_attention backend_cpu_attention_kernel(void);
void backend_cpu_attention_use(enum cpu_attention kernel);

#endif
