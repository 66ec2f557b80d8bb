#include "hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/hf_json.h"
#include "core/util.h"
#include "model/arch.h"

/* ---- tensor names --------------------------------------------------------------------- */

void hf_tensor_name(const struct model *m, const struct tensor_desc *t, int prefix, char *out, size_t cap)
{
    bool gpt2 = arch_is(m->cfg.type, ARCH_GPT2);
    snprintf(out, cap, "%s%s", gpt2 && prefix ? "transformer." : "", t->name);
}

/* ---- the parameter source --------------------------------------------------------------- */

/* Phi-3's fused projections: the part's name suffix, the whole's, and the
 * rows before the part as a count of (q heads, key/value heads, MLP rows). */
static const struct {
    const char *part, *whole;
    int q, kv, f;
} fused_parts[] = {
    {"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, 0, 0},
    {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", 1, 0, 0},
    {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", 1, 1, 0},
    {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, 0, 0},
    {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", 0, 0, 1},
};

bool hf_fused_part(const struct model *m, const struct tensor_desc *t, char *whole, size_t cap, int *row0,
                   int *whole_rows)
{
    if (!m->cfg.fused_projections)
        return false;
    const int Q = m->cfg.n_head * m->cfg.head_dim, KV = m->cfg.n_kv_head * m->cfg.head_dim, F = m->cfg.ffn_dim;
    const size_t len = strlen(t->name);
    for (size_t i = 0; i < sizeof fused_parts / sizeof fused_parts[0]; i++) {
        const size_t n = strlen(fused_parts[i].part);
        if (len < n || strcmp(t->name + len - n, fused_parts[i].part) != 0)
            continue;
        snprintf(whole, cap, "%.*s%s", (int)(len - n), t->name, fused_parts[i].whole);
        *row0 = fused_parts[i].q * Q + fused_parts[i].kv * KV + fused_parts[i].f * F;
        *whole_rows = fused_parts[i].whole[0] == 's' ? Q + 2 * KV : 2 * F;
        return true;
    }
    return false;
}

static const struct st_tensor *find_tensor(const struct hf_source *s, const struct tensor_desc *t)
{
    char name[ST_MAX_NAME + 16];
    hf_tensor_name(s->m, t, 0, name, sizeof name);
    const struct st_tensor *st = st_find(&s->st, name);
    if (!st) {
        hf_tensor_name(s->m, t, 1, name, sizeof name);
        st = st_find(&s->st, name);
    }
    /* Gemma3ForConditionalGeneration's language model: model.language_model.X (transformers 5), or
     * language_model.model.X (4.x), for shardlm's model.X */
    static const char *const multimodal[] = {"model.language_model.", "language_model.model."};
    for (size_t i = 0; !st && arch_is(s->m->cfg.type, ARCH_GEMMA) && i < 2; i++)
        if (strncmp(t->name, "model.", 6) == 0) {
            snprintf(name, sizeof name, "%s%s", multimodal[i], t->name + 6);
            st = st_find(&s->st, name);
        }
    return st;
}

/* Whether a tensor the model does not read is one transformers does not load
 * either: GPT-2's causal-mask buffers, Llama's rotary frequencies, or an LM
 * head stored beside the embedding it is tied to. */
static bool ignorable_tensor(const struct model *m, const char *name)
{
    static const char *const ends[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
    /* Gemma3ForConditionalGeneration's vision tower and projector (config.json's reading logs the skip) */
    static const char *const vision[] = {"model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                                         "multi_modal_projector."};
    for (size_t k = 0; arch_is(m->cfg.type, ARCH_GEMMA) && k < sizeof vision / sizeof vision[0]; k++)
        if (strncmp(name, vision[k], strlen(vision[k])) == 0)
            return true;
    if (arch_is(m->cfg.type, ARCH_GEMMA) && m->cfg.tied_head &&
        (!strcmp(name, "lm_head.weight") || !strcmp(name, "language_model.lm_head.weight")))
        return true;
    const size_t len = strlen(name);
    for (size_t k = 0; k < sizeof ends / sizeof ends[0]; k++)
        if (len >= strlen(ends[k]) && strcmp(name + len - strlen(ends[k]), ends[k]) == 0)
            return true;
    return m->cfg.tied_head && strcmp(name, "lm_head.weight") == 0;
}

/* Every tensor of the files must be one the model reads: weights of layers
 * config.json does not count (num_hidden_layers below the files') would
 * otherwise be dropped without a word. */
static void refuse_unused_tensors(const struct hf_source *s, const char *dir)
{
    bool *used = xcalloc((size_t)s->st.n_tensors + 1, sizeof *used);
    for (int u = 0; u < s->m->n_units; u++)
        for (int i = 0; i < s->m->units[u].n_tensors; i++)
            if (s->map[u][i])
                used[s->map[u][i] - s->st.tensors] = true;
    for (int k = 0; s->bnb_used && k < s->st.n_tensors; k++)
        used[k] = used[k] || s->bnb_used[k];
    if (s->tied_embed_unread) /* read by transformers 4.x too, then replaced by lm_head.weight */
        used[s->tied_embed_unread - s->st.tensors] = true;
    char list[512] = "";
    int n = 0;
    for (int k = 0; k < s->st.n_tensors; k++)
        if (!used[k] && !ignorable_tensor(s->m, s->st.tensors[k].name) && n++ < 3) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "", s->st.tensors[k].name);
        }
    free(used);
    if (n)
        fail_input("model.from_pretrained '%s': %d tensor%s of its .safetensors files the model of its config.json "
                   "does not use (%s%s): config.json and the weights do not match (num_hidden_layers?); fix "
                   "config.json or the files",
                   dir, n, n == 1 ? "" : "s", list, n > 3 ? ", ..." : "");
}

/* Values compared a piece at a time (fp32 elements), so that no whole tensor is held in memory. */
#define TIED_COMPARE_ELEMS ((size_t)1 << 16)

/* tie_word_embeddings with an lm_head.weight stored beside the embedding: read as transformers 4.x reads it.
 * transformers 4.40 loads both names and ties the parameters after, so the tied tensor (input embedding and
 * LM head) holds lm_head.weight's values; transformers 5.25 keeps embed_tokens for the input and lm_head for the
 * output, untied (both checked by tests/t_hf5.py tied_*). shardlm keeps the model tied, as config.json says, so it
 * follows 4.x: the tied tensor is read from lm_head.weight. When the two differ no reading is right for both
 * versions: one warning says so. The comparison reads both tensors whole on every rank (a piece at a time),
 * a cost only such directories pay. The embedding is the first tensor of unit 0 in every family. */
static void read_tied_head_as_transformers(struct hf_source *s, const char *dir)
{
    const struct st_tensor *head = st_find(&s->st, "lm_head.weight"), *embed = s->map[0][0];
    if (!s->m->cfg.tied_head || !head || !embed || head->ndim != 2 || head->shape[0] != embed->shape[0] ||
        head->shape[1] != embed->shape[1])
        return;
    s->map[0][0] = head;
    s->tied_embed_unread = embed;
    const size_t n = (size_t)embed->shape[0] * (size_t)embed->shape[1];
    float *a = xmalloc(TIED_COMPARE_ELEMS * sizeof *a), *b = xmalloc(TIED_COMPARE_ELEMS * sizeof *b);
    double max_diff = 0.0;
    for (size_t at = 0; at < n; at += TIED_COMPARE_ELEMS) {
        const size_t k = n - at < TIED_COMPARE_ELEMS ? n - at : TIED_COMPARE_ELEMS;
        st_read(&s->st, embed, at, k, a);
        st_read(&s->st, head, at, k, b);
        for (size_t i = 0; i < k; i++)
            max_diff = fmax(max_diff, fabs((double)a[i] - (double)b[i]));
    }
    free(a);
    free(b);
    if (max_diff > 0.0)
        log_warn("model.from_pretrained '%s': tie_word_embeddings is true but lm_head.weight differs from %s (by up "
                 "to %g): read as transformers 4.x does, lm_head.weight for both the embedding and the LM head "
                 "(transformers 5 keeps the two apart); make them equal, or set tie_word_embeddings false",
                 dir, embed->name, max_diff);
}

void hf_source_open(struct hf_source *s, const struct model *m, const char *dir)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    st_open(&s->st, dir);
    s->map = xcalloc((size_t)m->n_units, sizeof *s->map);
    s->elem0 = xcalloc((size_t)m->n_units, sizeof *s->elem0);
    s->bnb = xcalloc((size_t)s->st.n_tensors + 1, sizeof *s->bnb);
    s->bnb_used = xcalloc((size_t)s->st.n_tensors + 1, sizeof *s->bnb_used);
    for (int u = 0; u < m->n_units; u++) {
        const struct unit_desc *ud = &m->units[u];
        s->map[u] = xcalloc((size_t)ud->n_tensors, sizeof *s->map[u]);
        s->elem0[u] = xcalloc((size_t)ud->n_tensors, sizeof *s->elem0[u]);
        for (int i = 0; i < ud->n_tensors && !model_is_adapter(m, u); i++) {
            const struct tensor_desc *t = &ud->tensors[i];
            char whole[ST_MAX_NAME + 16];
            int row0 = 0, whole_rows = 0;
            const bool part = hf_fused_part(m, t, whole, sizeof whole, &row0, &whole_rows);
            const struct st_tensor *st = part ? st_find(&s->st, whole) : find_tensor(s, t);
            if (!st)
                fail_input("model.from_pretrained '%s': tensor '%s' is in no .safetensors file of the directory; "
                           "the checkpoint does not match its config.json",
                           dir, part ? whole : t->name);
            struct hf_bnb_weight w;
            if (!part && hf_bnb_find(&s->st, st->name, t, &w, s->bnb_used)) { /* 4-bit: checked by its quant state */
                s->bnb[st - s->st.tensors] = xmalloc(sizeof w);
                *s->bnb[st - s->st.tensors] = w;
                s->bnb_weights++;
                s->map[u][i] = st;
                continue;
            }
            if (st->bytes)
                fail_input("%s: tensor '%s' is U8 without a bitsandbytes quant state beside it; shardlm reads F32, "
                           "F16, BF16 and bitsandbytes' 4-bit weights",
                           s->st.paths[st->file], st->name);
            /* (out, in) or (in, out) as stored; the embedding and LM head without the vocabulary padding; a
             * fused part: its rows of the whole */
            int64_t want0 = part ? whole_rows : t->rows_valid, want1 = t->ndim == 2 ? t->shape[1] : 0;
            s->elem0[u][i] = (size_t)row0 * (size_t)t->shape[1];
            bool ok = st->ndim == t->ndim && st->shape[0] == want0 && (t->ndim == 1 || st->shape[1] == want1);
            if (!ok)
                fail_input("%s: tensor '%s' has shape [%lld%s%lld]; config.json gives [%lld%s%lld]",
                           s->st.paths[st->file], st->name, (long long)st->shape[0], st->ndim > 1 ? ", " : "",
                           st->ndim > 1 ? (long long)st->shape[1] : 0LL, (long long)want0, t->ndim > 1 ? ", " : "",
                           t->ndim > 1 ? (long long)want1 : 0LL);
            s->map[u][i] = st;
        }
    }
    read_tied_head_as_transformers(s, dir);
    refuse_unused_tensors(s, dir);
}

void hf_source_close(struct hf_source *s)
{
    for (int u = 0; s->map && u < s->m->n_units; u++) {
        free(s->map[u]);
        free(s->elem0[u]);
    }
    free(s->map);
    free(s->elem0);
    for (int k = 0; s->bnb && k < s->st.n_tensors; k++)
        free(s->bnb[k]);
    free(s->bnb);
    free(s->bnb_used);
    st_close(&s->st);
    memset(s, 0, sizeof *s);
}

/* Walks unit u's elements [begin, begin + count) in order: the file's rows of
 * each tensor go to read(t, first element in t, count, index into out), the
 * rest (alignment gaps, padded rows, unit padding) to zero(index, count). */
static void walk_range(const struct hf_source *s, int u, size_t begin, size_t count,
                       void (*read)(void *, const struct st_tensor *, size_t, size_t, size_t),
                       void (*zero)(void *, size_t, size_t), void *ctx)
{
    const struct unit_desc *ud = &s->m->units[u];
    const size_t end = begin + count;
    size_t pos = begin;
    for (int i = 0; i < ud->n_tensors; i++) {
        const struct tensor_desc *t = &ud->tensors[i];
        size_t valid = (size_t)t->rows_valid * (size_t)t->shape[1];
        size_t lo = t->offset > pos ? t->offset : pos;
        size_t hi = t->offset + valid < end ? t->offset + valid : end;
        if (!s->map[u][i] || lo >= hi)
            continue;
        if (lo > pos)
            zero(ctx, pos - begin, lo - pos);
        read(ctx, s->map[u][i], s->elem0[u][i] + (lo - t->offset), hi - lo, lo - begin);
        pos = hi;
    }
    if (pos < end)
        zero(ctx, pos - begin, end - pos);
}

struct read_ctx {
    struct hf_source *s;
    void *out;
    size_t esize; /* of an element of out */
    void (*landed)(void *, size_t); /* hf_source_read_as's progress, or NULL */
    void *landed_ctx;
    size_t at;    /* where in out the tensor being read starts */
};

static void landed_in_tensor(void *c, size_t k)
{
    struct read_ctx *r = c;
    r->landed(r->landed_ctx, r->at + k);
}

/* A NaN or Inf weight is named here: the first step would otherwise report
 * a non-finite loss and advise a lower learning rate. */
static void check_finite(const struct read_ctx *r, const struct st_tensor *t, const void *x, enum dtype dt, size_t n)
{
    if (!dtype_all_finite(x, dt, n))
        fail_input("%s: tensor '%s' holds NaN or Inf values; the weights are damaged (download or convert them again)",
                   r->s->st.paths[t->file], t->name);
}

static void read_f32(void *c, const struct st_tensor *t, size_t first, size_t n, size_t at)
{
    struct read_ctx *r = c;
    const struct hf_bnb_weight *w = r->s->bnb[t - r->s->st.tensors];
    if (w)
        hf_bnb_read(&r->s->st, w, first, n, (float *)r->out + at);
    else
        st_read(&r->s->st, t, first, n, (float *)r->out + at);
    check_finite(r, t, (float *)r->out + at, DTYPE_F32, n);
}

static void read_raw(void *c, const struct st_tensor *t, size_t first, size_t n, size_t at)
{
    struct read_ctx *r = c;
    r->at = at;
    st_read_raw(&r->s->st, t, first, n, (char *)r->out + at * r->esize, r->landed ? landed_in_tensor : NULL, r);
    check_finite(r, t, (char *)r->out + at * r->esize, t->dtype, n);
}

static void zero_out(void *c, size_t at, size_t n)
{
    struct read_ctx *r = c;
    memset((char *)r->out + at * r->esize, 0, n * r->esize);
    if (r->landed)
        r->landed(r->landed_ctx, at + n);
}

void hf_source_read(void *source, int u, size_t begin, size_t count, float *out)
{
    const struct hf_source *s = source;
    if (model_is_adapter(s->m, u)) { /* LoRA's adapters are not in the base model's files: their init */
        model_init_range(s->m, u, begin, count, out);
        return;
    }
    struct read_ctx r = {source, out, sizeof(float), NULL, NULL, 0};
    walk_range(source, u, begin, count, read_f32, zero_out, &r);
}

bool hf_source_read_as(void *source, int u, size_t begin, size_t count, enum dtype dt, void *out,
                       void (*landed)(void *ctx, size_t elems), void *ctx)
{
    struct hf_source *s = source;
    if (model_is_adapter(s->m, u))
        return false;
    for (int i = 0; i < s->m->units[u].n_tensors; i++) /* a 4-bit weight's codes are bytes, whatever their dtype */
        if (s->map[u][i] && (s->map[u][i]->bytes || s->map[u][i]->dtype != dt || s->bnb[s->map[u][i] - s->st.tensors]))
            return false;
    struct read_ctx r = {s, out, (size_t)dtype_size(dt), landed, ctx, 0};
    walk_range(s, u, begin, count, read_raw, zero_out, &r);
    return true;
}

void hf_source_read_q4(void *source, int u, int t, size_t first, size_t n, const struct quant4_range *out)
{
    struct hf_source *s = source;
    const struct st_tensor *ft = s->map[u][t];
    const struct hf_bnb_weight *w = ft ? s->bnb[ft - s->st.tensors] : NULL;
    if (!w || s->elem0[u][t])
        fail_input("%s: '%s' is not stored in bitsandbytes' 4 bits beside the directory's other linear weights; "
                   "give a directory whose linear weights are all 4-bit, or the unquantized model",
                   s->dir, s->m->units[u].tensors[t].name);
    if (out->qabsmax && !w->nested_absmax)
        fail_input("%s: '%s' is stored without double quantization, but config.json's quantization_config has "
                   "bnb_4bit_use_double_quant true: the directory's files and its config.json disagree",
                   s->dir, s->m->units[u].tensors[t].name);
    hf_bnb_read_q4(&s->st, w, first, n, out);
}

double hf_source_bytes(const struct hf_source *s)
{
    double total = 0;
    for (int u = 0; u < s->m->n_units; u++)
        for (int i = 0; i < s->m->units[u].n_tensors; i++)
            if (s->map[u][i])
                total += (double)s->map[u][i]->numel * (double)st_elem_size(s->map[u][i]);
    return total;
}

/* ---- tokenizer files ------------------------------------------------------------------- */

static void copy_file(const char *src, const char *dst)
{
    int in = util_irregular(src) ? -1 : open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return; /* absent (or a FIFO, ...): nothing to copy */
    char tmp[2200];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0)
        fail_input("cannot write '%s': %s", tmp, strerror(errno));
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            fail_input("cannot write '%s': %s", tmp, strerror(errno));
    if (n < 0 || fsync(out) != 0 || close(out) != 0)
        fail_input("cannot copy '%s' to '%s': %s", src, tmp, strerror(errno));
    close(in);
    if (rename(tmp, dst) != 0)
        fail_input("cannot rename '%s' to '%s': %s", tmp, dst, strerror(errno));
}

void hf_copy_tokenizer(const char *src_dir, const char *dst_dir)
{
    /* chat_template.jinja and additional_chat_templates/ hold the chat templates of a tokenizer that
     * transformers 5 saved (no longer in tokenizer_config.json); chat_template.json a processor's. */
    static const char *const files[] = {"tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
                                        "tokenizer.model",     "generation_config.json", "vocab.json",
                                        "merges.txt",          "chat_template.jinja",   "chat_template.json"};
    static const char named_dir[] = "additional_chat_templates";
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[2100], dst[2100];
        snprintf(src, sizeof src, "%s/%s", src_dir, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dst_dir, files[i]);
        copy_file(src, dst);
    }
    char src[2100], dst[2100];
    snprintf(src, sizeof src, "%s/%s", src_dir, named_dir);
    DIR *named = opendir(src);
    if (!named)
        return; /* none: nothing to copy */
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, named_dir);
    if (mkdir(dst, 0755) != 0 && errno != EEXIST)
        fail_input("cannot make '%s': %s", dst, strerror(errno));
    for (struct dirent *e; (e = readdir(named));) {
        const size_t len = strlen(e->d_name);
        if (len <= 6 || strcmp(e->d_name + len - 6, ".jinja") != 0) /* what transformers reads there */
            continue;
        char src_file[2400], dst_file[2400];
        snprintf(src_file, sizeof src_file, "%s/%s", src, e->d_name);
        snprintf(dst_file, sizeof dst_file, "%s/%s", dst, e->d_name);
        copy_file(src_file, dst_file);
    }
    closedir(named);
}
