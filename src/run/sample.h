/*
 * sample — the choice of a next token from a row of logits (greedy, or as
 * Hugging Face samples: temperature, top-k, top-p), used by `shardlm
 * generate` (cli/generate.c) and the trainer's sample after its last step
 * (sample_text, here).
 */
#ifndef SHARDLM_SAMPLE_H
#define SHARDLM_SAMPLE_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/options.h"
#include "engine/session.h"

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
int32_t sample_choose(const float *logits, int V, const struct sampling *sp, uint64_t *rng, void *work);
#define SAMPLE_WORK_BYTES(V) ((size_t)(V) * 8)

/* Samples tokens from the model, starting from a newline (byte-level models)
 * or the tokenizer's end-of-sequence token, with `shardlm generate`'s choice
 * of a token (sample_choose at train.sample_temperature); prints the text,
 * decoded by model.from_pretrained's tokenizer.json when there is one, bytes
 * when the vocabulary is byte-level (256), token ids otherwise. The training
 * activations are released (session_reshape) for a key and value cache of
 * one row when it fits what the training plan reserved per buffer class;
 * otherwise, and for the tokens past seq_len (a sliding window), each token
 * runs the context again through the training activations. s: the trainer's
 * session, its activations replaced; stopped (a collective after each token):
 * a stop signal's name, or NULL. */
void sample_text(struct session *s, const struct config *cfg, const char *(*stopped)(struct comm *comm));

#endif
