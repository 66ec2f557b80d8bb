/*
 * ckpt_run — the one owner of what a run writes into a checkpoint and reads
 * back (io/ckpt.h is the file format; this is its content for shardlm's
 * runs): the trainer's save (fp32 masters, Adam state, step, scaler, data
 * position, the resolved config, the model's shape attributes, a LoRA run's
 * base identity) and resume (checked against the config), and the readers
 * of generate/eval (run/infer.c: the run's config, the masters as a
 * parameter source) and of the checkpoint tools (cli/ckpt_tools.c: the
 * model and LoRA section a checkpoint describes).
 */
#ifndef SHARDLM_CKPT_RUN_H
#define SHARDLM_CKPT_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/options.h"
#include "io/ckpt.h"
#include "model/model.h"

struct trainer;

/* Saves the whole training state into checkpoint.dir (then checkpoint.export_hf). Collective. */
void ckpt_run_save(struct trainer *tr);
/* Continues from a checkpoint when --resume names one (or "auto" finds one). */
void ckpt_run_resume(struct trainer *tr, const char *spec);

/* The sections of a checkpoint's run config that say what the model is and
 * how it runs; model.from_pretrained goes to base (see ckpt_run.c). */
json_t *ckpt_run_infer_config(struct ckpt_reader *r, const char *path, char *base, size_t cap);
/* A checkpoint's fp32 masters as a parameter source (zero.h struct param_source): ctx a struct ckpt_run_source. */
struct ckpt_run_source {
    const struct model *m;
    struct ckpt_reader *r;
};
void ckpt_run_source_read(void *ctx, int u, size_t begin, size_t count, float *out);
/* The model described by the checkpoint's attributes. */
void ckpt_run_model(struct ckpt_reader *r, const char *path, struct model *m);
/* A LoRA checkpoint's lora section into cfg (see ckpt_run.c); false without one. */
bool ckpt_run_lora(struct ckpt_reader *r, const char *path, struct config *cfg);

#endif
