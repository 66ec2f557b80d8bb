/*
 * lora_merge — a LoRA checkpoint's adapters folded into its base (see lora_merge.h).
 */
#include "lora_merge.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peft_export.h"
#include "core/util.h"

/* The base directory is there and describes the checkpoint's model. */
static void check_base(const struct model *m, const char *dir, const char *what)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        fail_input("export --merge: the base model directory '%s' (%s): %s; give the Hugging Face directory the "
                   "adapters were trained on with --base DIR",
                   dir, what, stat(dir, &st) != 0 ? strerror(errno) : "is not a directory");
    const char *key;
    long long have, want;
    int differs = hf_config_differs(m, dir, &key, &have, &want);
    if (differs < 0)
        fail_input("export --merge: the base '%s' (%s) has no readable config.json; give the Hugging Face directory "
                   "the adapters were trained on with --base DIR",
                   dir, what);
    if (differs && have < 0)
        fail_input("export --merge: the base '%s' (%s) is another model: its config.json has no %s (the "
                   "checkpoint's model has %lld); give the base the adapters were trained on with --base DIR",
                   dir, what, key, want);
    if (differs)
        fail_input("export --merge: the base '%s' (%s) is another model: its config.json's %s is %lld, the "
                   "checkpoint's %lld; give the base the adapters were trained on with --base DIR",
                   dir, what, key, have, want);
}

void lora_merge_open(struct lora_merge *g, const struct model *m, struct ckpt_reader *r, const char *base_dir,
                     const char *what, const struct quant_config *quant)
{
    if (!m->lora.on)
        fail_internal("lora_merge_open: the model has no LoRA adapters");
    memset(g, 0, sizeof *g);
    g->m = m;
    g->r = r;
    g->pair_unit = g->pair_a = -1;
    check_base(m, base_dir, what);
    hf_source_open(&g->base, m, base_dir); /* checks every base tensor's shape in the files */
    /* a base saved 4-bit is read dequantized already (hf_bnb.h) */
    g->quantize = quant && quant->load_in_4bit && g->base.bnb_weights == 0;
    if (g->quantize)
        quant_reader_init(&g->quant, m, quant, hf_source_read, &g->base);
}

void lora_merge_close(struct lora_merge *g)
{
    if (g->quantize)
        quant_reader_free(&g->quant);
    hf_source_close(&g->base);
    free(g->A);
    free(g->B);
    free(g->delta);
    memset(g, 0, sizeof *g);
}

static void read_master(struct ckpt_reader *r, const struct tensor_desc *t, size_t begin, size_t count, float *out)
{
    const size_t shape[2] = {(size_t)t->shape[0], t->ndim == 2 ? (size_t)t->shape[1] : 0};
    ckpt_read(r, "master", t->name, t->ndim, shape, begin, count, out);
}

/* Reads the adapter pair whose lora_A is tensor a of unit u into A and B. */
static void load_pair(struct lora_merge *g, int u, int a, int b)
{
    if (g->pair_unit == u && g->pair_a == a)
        return;
    const struct tensor_desc *ta = &g->m->units[u].tensors[a], *tb = &g->m->units[u].tensors[b];
    g->A = xrealloc(g->A, ta->numel * sizeof *g->A);
    g->B = xrealloc(g->B, tb->numel * sizeof *g->B);
    read_master(g->r, ta, 0, ta->numel, g->A);
    read_master(g->r, tb, 0, tb->numel, g->B);
    g->pair_unit = u;
    g->pair_a = a;
}

/* out += elements [begin, begin + count) of scale B A ((out, in) weights) or
 * of its transpose ((in, out): fan_in_fan_out), computed for the rows the
 * range touches. */
static void add_delta(struct lora_merge *g, const struct model_linear *li, size_t begin, size_t count, float *out)
{
    const int r = g->m->lora.r;
    const bool in_major = peft_fan_in_fan_out(g->m);
    const size_t cols = (size_t)(in_major ? li->out : li->in);
    const size_t row0 = begin / cols, rows = (begin + count + cols - 1) / cols - row0;
    if (rows * cols > g->delta_cap) {
        g->delta_cap = rows * cols;
        g->delta = xrealloc(g->delta, g->delta_cap * sizeof *g->delta);
    }
    if (in_major) /* delta[i][o] = scale sum_k A[k][i] B[o][k], rows i from row0 */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, (int)rows, li->out, r, g->m->lora.scale, g->A + row0,
                    li->in, g->B, r, 0.0f, g->delta, li->out);
    else /* delta[o][i] = scale sum_k B[o][k] A[k][i], rows o from row0 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, li->in, r, g->m->lora.scale,
                    g->B + row0 * (size_t)r, r, g->A, li->in, 0.0f, g->delta, li->in);
    const float *d = g->delta + (begin - row0 * cols);
    for (size_t j = 0; j < count; j++)
        out[j] += d[j];
}

void lora_merge_read(struct lora_merge *g, int u, int t, size_t begin, size_t count, float *out)
{
    const struct model *m = g->m;
    const struct unit_desc *ud = &m->units[u];
    const struct tensor_desc *td = &ud->tensors[t];
    if (model_is_adapter(m, u))
        fail_internal("lora_merge_read: '%s' is an adapter, not a base tensor", td->name);
    if (!td->frozen) { /* lora.modules_to_save: trained in full */
        read_master(g->r, td, begin, count, out);
        return;
    }
    if (g->quantize)
        quant_reader_read(&g->quant, u, td->offset + begin, count, out);
    else
        hf_source_read(&g->base, u, td->offset + begin, count, out);
    if (ud->kind != UNIT_BLOCK)
        return;
    for (int k = 0; k < m->lora.n_linear; k++) {
        /* the layer's weight spans its out x in elements from its first tensor: a fused layer's parts (Phi-3's
         * q|k|v, gate|up) lie inside it, each at its own offset */
        const struct model_linear *li = &m->lora.linear[k];
        const size_t first = ud->tensors[li->tensor].offset, span = (size_t)li->out * (size_t)li->in;
        const int a = m->lora.a_tensor[ud->block][k];
        if (a < 0 || td->offset < first || td->offset + td->numel > first + span)
            continue;
        load_pair(g, m->lora.unit[ud->block], a, m->lora.b_tensor[ud->block][k]);
        add_delta(g, li, td->offset - first + begin, count, out);
    }
}
