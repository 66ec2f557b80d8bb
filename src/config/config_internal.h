/*
 * config_internal — what the files of the config module (config.h) share;
 * nothing outside src/config/ includes it.
 *
 *   config.c           the JSON document (file, --deepspeed merge, --set) and
 *                      the order in which the sections are read; config_dump,
 *                      config_free
 *   config_schema.c    the key table and check_keys()
 *   config_values.c    dotted key paths, typed reads with defaults, range
 *                      checks, saturating size arithmetic
 *   config_shardlm.c   shardlm's sections: model, data, train, checkpoint
 *   config_deepspeed.c DeepSpeed's sections: batch, optimizer, scheduler,
 *                      fp16/bf16, zero_optimization, activation_checkpointing
 *   config_lora.c      the lora section
 *   config_dpo.c       the dpo section
 *   config_quant.c     the quantization section (BitsAndBytesConfig's names)
 *
 * Every read_*() of a section fills its part of struct config from the
 * document and writes the defaults it used back into it (so the document is
 * the resolved config); every error is a fail_input naming the key path.
 */
#ifndef SHARDLM_CONFIG_INTERNAL_H
#define SHARDLM_CONFIG_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/* Longest key path handled ("zero_optimization.offload_optimizer.pin_memory"
 * is 45 characters). */
#define KEY_PATH_CAP 512

/* ---- schema (config_schema.c) ------------------------------------------ */

enum key_kind { K_INT, K_NUM, K_BOOL, K_STR, K_OBJ, K_ARRAY, K_ANY };

enum key_flags {
    F_NO_EFFECT = 1u << 0, /* accepted, warned about once, changes nothing */
    F_NULLABLE = 1u << 1,  /* null means "not given" (as DeepSpeed's None) */
    F_REJECT = 1u << 2,    /* a DeepSpeed key shardlm refuses; hint says why */
};

/* One row of the schema. The last three fields are the configuration
 * reference (`shardlm config --reference`, docs/configuration.md), printed
 * from this table, so the documentation and the reader are one table:
 * every row that is neither F_NO_EFFECT nor F_REJECT must have `doc`
 * (config_print_reference refuses otherwise, and tests/t_docs.py with it). */
struct key_spec {
    const char *name;
    enum key_kind kind;
    unsigned flags;
    const struct key_spec *children; /* K_OBJ: its keys, ended by {0} */
    const char *hint;                /* F_NO_EFFECT: why; F_REJECT: the error */
    const char *def;     /* the default in words ("`false`"; NULL: none, the key is optional or required) */
    const char *allowed; /* the values accepted, in words (NULL: any of the type); "@presets" and "@types"
                            print the architecture table's names */
    const char *doc;     /* one line: what the key does */
};

/* The top level of the document. */
extern const struct key_spec top_keys[];

/* Checks every key of `obj` against `specs`, recursively; warns once for each
 * key that is accepted without effect. */
void check_keys(json_t *obj, const char *prefix, const struct key_spec *specs);

/* ---- JSON helpers (config_values.c) ------------------------------------ */

void join_path(char *out, size_t cap, const char *prefix, const char *key);
const char *json_kind_name(const json_t *v);
/* Compact text of a value for messages, shortened to fit `cap`. */
const char *json_brief(const json_t *v, char *out, size_t cap);
/* The value at a dotted path; NULL when absent, null, or below a non-object. */
json_t *doc_get(json_t *root, const char *path);
/* Sets the value at a dotted path (the reference to `value` is stolen),
 * creating missing or null objects on the way. When something on the way is
 * neither, returns false and writes its path into `blocker`. */
bool doc_put(json_t *root, const char *path, json_t *value, char *blocker, size_t blocker_cap);
/* Writes a default back so the document shows the resolved value. */
void put_default(json_t *root, const char *path, json_t *value);

/* ---- typed reads with defaults (config_values.c) ----------------------- */

enum fill_mode { NO_FILL = 0, FILL = 1 };

bool is_given(json_t *root, const char *path);
long long read_int64(json_t *root, const char *path, long long def, enum fill_mode fill);
int read_int(json_t *root, const char *path, int def, enum fill_mode fill);
double read_num(json_t *root, const char *path, double def, enum fill_mode fill);
bool read_bool(json_t *root, const char *path, bool def, enum fill_mode fill);
/* The string at path (owned by the document), or def (NULL: not given). */
const char *read_str(json_t *root, const char *path, const char *def, enum fill_mode fill);
/* An optional non-empty path string, copied (NULL when not given). */
char *read_path(json_t *root, const char *path);
void require_positive(const char *path, long long v);
void require_non_negative(const char *path, long long v);
void require_non_negative_num(const char *path, double v);
void require_ratio(const char *path, double v);

/* ---- size bounds (config_values.c) ------------------------------------- */

/* Every size the keys multiply into is computed here first, in saturating
 * 64-bit arithmetic, and bounded, so that the model, the planner and the
 * kernels never see a product that wraps (size_t or the kernels' int row
 * counts). The bounds are far above any model or batch that fits a node:
 * 2^40 elements (4 TiB in fp32) for one tensor or activation buffer, 2^44 for
 * the activations of all layers, 2^16 layers. */
#define CONFIG_MAX_TENSOR (1LL << 40)
#define CONFIG_MAX_ALL_LAYERS (1LL << 44)
#define CONFIG_MAX_LAYERS 65536
#define CONFIG_MAX_SAMPLE_TOKENS (1 << 20)
#define CONFIG_MAX_THREADS 4096

long long sat_mul(long long a, long long b);
long long sat_add(long long a, long long b);
/* Fails when n elements of what exceed limit; keys names the keys that set it
 * and their values, as the user wrote them. */
void check_bound(const char *what, long long n, long long limit, const char *keys);

/* ---- sections, in the order config.c reads them ------------------------ */

/* Records model.from_pretrained in m->pretrained (config_begin's last step). */
void read_pretrained(struct model_config *m, json_t *root); /* config_shardlm.c */

void read_model(struct config *cfg, json_t *root);      /* config_shardlm.c */
void read_lora(struct config *cfg, json_t *root);       /* config_lora.c */
void read_dpo(struct config *cfg, json_t *root);        /* config_dpo.c */
void read_quantization(struct config *cfg, json_t *root); /* config_quant.c */
void read_data(struct config *cfg, json_t *root);       /* config_shardlm.c */
void read_train(struct config *cfg, json_t *root);      /* config_shardlm.c */
void read_checkpoint(struct config *cfg, json_t *root); /* config_shardlm.c */
void read_batch(struct config *cfg, json_t *root);      /* config_deepspeed.c, and the rest */
void read_optimizer(struct config *cfg, json_t *root);
void read_scheduler(struct config *cfg, json_t *root);
void read_precision(struct config *cfg, json_t *root);
void read_zero(struct config *cfg, json_t *root);
void read_act_ckpt(struct config *cfg, json_t *root);
/* The activation sizes of one micro-batch (after the batch is resolved). */
void check_batch_sizes(const struct config *cfg);

#endif
