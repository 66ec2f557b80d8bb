/*
 * infer — a model opened for forward passes only: `shardlm generate` and
 * `shardlm eval` (generate.c), and the trainer's end-of-run sample.
 *
 * MODEL is a Hugging Face directory (config.json + safetensors, as
 * model.from_pretrained reads it), a checkpoint file, or a directory of
 * checkpoints (a run's checkpoint.dir: its latest). A checkpoint brings its
 * run's resolved config (model, lora, dtype, ZeRO settings, data options);
 * its weights are the fp32 masters it holds. A LoRA checkpoint holds only
 * the adapters (and modules_to_save): its base is read from --base, else
 * from the model.from_pretrained its run recorded, else the run's seeded
 * init, and must have the checksum the checkpoint records.
 *
 * Every unit is frozen (model_freeze_all): no gradient, master or optimizer
 * state, so a sharded model costs its parameter shards and the gathered
 * units, as in a LoRA run's base. Under mpirun every rank opens the same
 * model; ZeRO's stage (zero_optimization.stage, --set) shards it as in
 * training, default stage 3 at more than one rank. Failures are agreed
 * across ranks and reported once (exit status 2 for bad input).
 */
#ifndef SHARDLM_INFER_H
#define SHARDLM_INFER_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "config/config.h"
#include "engine/session.h"

struct tokenizer;

struct infer_options {
    const char *model;             /* MODEL as above */
    const char *base;              /* --base: a LoRA checkpoint's base directory (NULL: the recorded one) */
    const char *tokenizer;         /* --tokenizer: a tokenizer.json (NULL: the model's or base's directory) */
    const char *data;              /* eval: the data file (data.train of the config, so its options apply) */
    int seq_len;                   /* eval --seq-len: its own length, over the checkpoint's (0: none given) */
    const char *const *sets;       /* --set KEY.PATH=VALUE overrides */
    int n_sets;
};

struct infer {
    struct config cfg;
    struct session sess;           /* the engine: model, plan, arenas, ZeRO state, activations, cache */
    struct tokenizer *tok;         /* NULL: none found (byte-level models print bytes) */
    char tokenizer_path[4200];
    int32_t eos[8];                /* end-of-sequence ids (config.json's eos_token_id, else the tokenizer's) */
    int n_eos;
    char eos_problem[4800];        /* generation_config.json unusable (not JSON, eos_token_id no id): the line
                                    * generate refuses with (infer_require_eos); "" when fine */
    char ckpt_path[4096];          /* the checkpoint read, "" for a Hugging Face directory */
    char hf_dir[4096];             /* the Hugging Face directory read (the model, or a LoRA checkpoint's base), "" */
    bool lora_ckpt;
    bool *trained;                 /* [unit] what the run trained (model_add_lora's choice), before every unit is
                                    * frozen: a LoRA checkpoint's units */
};

/* Resolves MODEL, builds the config (o->sets applied) and the model, finds
 * the tokenizer; reads no weights yet. Collective. */
void infer_open(struct infer *s, struct comm *comm, const struct infer_options *o);
/* Fails (exit status 2) in one line naming generation_config.json when it is not JSON or its eos_token_id
 * is no token id of the model (generate: where a sequence ends; eval does not need it). */
void infer_require_eos(const struct infer *s);
/* Fails (exit status 2) when the model has no tokenizer and its vocabulary
 * is not byte-level: `why` says what needs one. */
void infer_require_tokenizer(const struct infer *s, const char *model, const char *why);
/* Plans and allocates forwards of B rows of at most T tokens (and a cache of
 * Tmax positions per row when Tmax > 0), then reads the weights. Collective. */
void infer_start(struct infer *s, const struct infer_options *o, int B, int T, int Tmax);
void infer_close(struct infer *s);

/* Forwards go through session_forward(&s->sess, ...) (engine/session.h). */

#endif
