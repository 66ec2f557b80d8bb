/*
 * generate — the `shardlm generate` and `shardlm eval` commands (generate.c).
 */
#ifndef SHARDLM_GENERATE_H
#define SHARDLM_GENERATE_H

#include <stdint.h>

struct sampling {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: all */
    float top_p;       /* 1: all */
    uint64_t seed;
};

/* The next token from one row of logits (V of them): the first largest when
 * greedy; else as Hugging Face's sampling: logits / temperature, the top_k
 * largest, the smallest set of the largest whose probabilities reach top_p,
 * one drawn from those by their probabilities with rng. work: V * 8 bytes. */
int32_t generate_choose(const float *logits, int V, const struct sampling *sp, uint64_t *rng, void *work);
#define GENERATE_WORK_BYTES(V) ((size_t)(V) * 8)

int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
