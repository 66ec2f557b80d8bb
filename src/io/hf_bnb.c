/*
 * hf_bnb — reading bitsandbytes' 4-bit weights from a Hugging Face directory
 * (contract in hf_bnb.h).
 */
#include "hf_bnb.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant4.h"
#include "core/util.h"

static const struct st_tensor *companion(const struct st_model *st, const char *name, const char *suffix, bool *used)
{
    char full[ST_MAX_NAME + 64];
    snprintf(full, sizeof full, "%s%s", name, suffix);
    const struct st_tensor *t = st_find(st, full);
    if (t)
        used[t - st->tensors] = true;
    return t;
}

static const char *path_of(const struct st_model *st, const struct st_tensor *t) { return st->paths[t->file]; }

/* The quant state blob as JSON (a new reference). */
static json_t *read_state(struct st_model *st, const struct st_tensor *state)
{
    if (!state->bytes || state->numel > 65536)
        fail_input("%s: '%s' is not a bitsandbytes quant state (U8 JSON); the file is damaged", path_of(st, state),
                   state->name);
    char *text = xmalloc(state->numel + 1);
    st_read_raw(st, state, 0, state->numel, text, NULL, NULL);
    text[state->numel] = '\0';
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    free(text);
    if (!json_is_object(root))
        fail_input("%s: '%s' is not valid JSON (%s); the file is damaged", path_of(st, state), state->name, err.text);
    return root;
}

/* A table in the files must be the one bitsandbytes' CPU and CUDA kernels use. */
static void check_table(struct st_model *st, const struct st_tensor *t, const float *want, size_t n)
{
    if (!t || t->bytes || t->dtype != DTYPE_F32 || t->numel != n)
        fail_input("%s: '%s' is missing or is not %zu fp32 values; the directory is not bitsandbytes' format",
                   t ? path_of(st, t) : "model", t ? t->name : "quant_map", n);
    float *have = xmalloc(n * sizeof(float));
    st_read(st, t, 0, n, have);
    for (size_t i = 0; i < n; i++)
        if (have[i] != want[i])
            fail_input("%s: '%s'[%zu] is %g, not bitsandbytes' %g: a custom table is not supported", path_of(st, t),
                       t->name, i, have[i], want[i]);
    free(have);
}

bool hf_bnb_find(struct st_model *st, const char *name, const struct tensor_desc *t, struct hf_bnb_weight *w,
                 bool *used)
{
    const struct st_tensor *state = companion(st, name, ".quant_state.bitsandbytes__nf4", used);
    if (!state)
        state = companion(st, name, ".quant_state.bitsandbytes__fp4", used);
    if (!state)
        return false;
    const char *file = path_of(st, state);
    memset(w, 0, sizeof *w);
    json_t *js = read_state(st, state);
    const char *type = json_string_value(json_object_get(js, "quant_type"));
    w->type = type ? quant4_type_parse(type) : -1;
    if (w->type < 0)
        fail_input("%s: '%s': quant_type %s is not nf4 or fp4", file, state->name, type ? type : "(none)");
    if (json_integer_value(json_object_get(js, "blocksize")) != QUANT4_BLOCK)
        fail_input("%s: '%s': blocksize %lld; shardlm reads bitsandbytes' 4-bit weights in blocks of %d "
                   "(transformers' only size)",
                   file, state->name, (long long)json_integer_value(json_object_get(js, "blocksize")), QUANT4_BLOCK);
    json_t *shape = json_object_get(js, "shape");
    const long long rows = (long long)json_integer_value(json_array_get(shape, 0)),
                    cols = (long long)json_integer_value(json_array_get(shape, 1));
    if (json_array_size(shape) != 2 || rows != t->shape[0] || cols != t->shape[1])
        fail_input("%s: '%s' gives shape [%lld, %lld] but the model's '%s' is [%d, %d]: the quant state does not "
                   "match the weight (config.json and the files disagree)",
                   file, state->name, rows, cols, t->name, t->shape[0], t->shape[1]);
    w->numel = t->numel;
    const size_t blocks = quant4_blocks(w->numel);
    /* the packed bytes, in the container bnb_4bit_quant_storage names: U8, or BF16 / F16 / F32 viewing the same
     * bytes (FSDP's setting) */
    w->codes = companion(st, name, "", used);
    if (!w->codes || w->codes->numel * st_elem_size(w->codes) != quant4_code_bytes(w->numel))
        fail_input("%s: '%s' should hold %zu packed bytes (U8, or that many bytes of BF16, F16 or F32 with "
                   "bnb_4bit_quant_storage) for [%lld, %lld]; the files do not match the quant state",
                   file, name, quant4_code_bytes(w->numel), rows, cols);
    w->absmax = companion(st, name, ".absmax", used);
    json_t *offset = json_object_get(js, "nested_offset");
    const bool nested = offset != NULL;
    if (!w->absmax || w->absmax->numel != blocks || w->absmax->bytes != nested ||
        (!nested && w->absmax->dtype != DTYPE_F32))
        fail_input("%s: '%s.absmax' should be %zu %s for [%lld, %lld]; the files do not match the quant state", file,
                   name, blocks, nested ? "bytes (U8, double quantization)" : "fp32 values", rows, cols);
    check_table(st, companion(st, name, ".quant_map", used), quant4_table((enum quant4_type)w->type), 16);
    if (nested) {
        w->offset = (float)json_number_value(offset);
        w->nested_absmax = companion(st, name, ".nested_absmax", used);
        if (json_integer_value(json_object_get(js, "nested_blocksize")) != QUANT4_NESTED_BLOCK || !w->nested_absmax ||
            w->nested_absmax->bytes || w->nested_absmax->dtype != DTYPE_F32 ||
            w->nested_absmax->numel != quant4_nested_blocks(blocks))
            fail_input("%s: '%s.nested_absmax' should be %zu fp32 values (blocks of %d); the files do not match the "
                       "quant state",
                       file, name, quant4_nested_blocks(blocks), QUANT4_NESTED_BLOCK);
        check_table(st, companion(st, name, ".nested_quant_map", used), quant4_dynamic_map(), 256);
    }
    json_decref(js);
    return true;
}

/* Bytes [begin, begin + count) of the packed codes, whatever their container's element size. */
static void read_code_bytes(struct st_model *st, const struct hf_bnb_weight *w, size_t begin, size_t count,
                            uint8_t *out)
{
    const size_t esize = st_elem_size(w->codes);
    if (begin % esize == 0 && count % esize == 0) {
        st_read_raw(st, w->codes, begin / esize, count / esize, out, NULL, NULL);
        return;
    }
    const size_t e0 = begin / esize, e1 = (begin + count + esize - 1) / esize; /* the elements around them */
    uint8_t *whole = xmalloc((e1 - e0) * esize);
    st_read_raw(st, w->codes, e0, e1 - e0, whole, NULL, NULL);
    memcpy(out, whole + (begin - e0 * esize), count);
    free(whole);
}

/* The fp32 absmax of blocks [nb0, b1) (nb0 on a nested block's start with double quantization) into absmax. */
static void read_absmax(struct st_model *st, const struct hf_bnb_weight *w, size_t nb0, size_t b0, size_t b1,
                        float *absmax)
{
    if (w->nested_absmax) {
        const size_t n0 = nb0 / QUANT4_NESTED_BLOCK, n1 = (b1 - 1) / QUANT4_NESTED_BLOCK + 1;
        uint8_t *qabsmax = xmalloc(b1 - nb0);
        float *nested = xmalloc((n1 - n0) * sizeof(float));
        st_read_raw(st, w->absmax, nb0, b1 - nb0, qabsmax, NULL, NULL);
        st_read(st, w->nested_absmax, n0, n1 - n0, nested);
        quant4_nested_dequantize(qabsmax, nested, w->offset, nb0, b1 - nb0, absmax);
        free(qabsmax);
        free(nested);
    } else {
        st_read(st, w->absmax, b0, b1 - b0, absmax);
    }
}

void hf_bnb_read(struct st_model *st, const struct hf_bnb_weight *w, size_t first, size_t n, float *out)
{
    if (n == 0)
        return;
    /* whole blocks around the range: from a nested block's start, so that the nested statistics line up */
    const size_t b0 = first / QUANT4_BLOCK, b1 = (first + n - 1) / QUANT4_BLOCK + 1;
    const size_t nb0 = w->nested_absmax ? b0 / QUANT4_NESTED_BLOCK * QUANT4_NESTED_BLOCK : b0;
    const size_t e0 = b0 * QUANT4_BLOCK, e1 = b1 * QUANT4_BLOCK < w->numel ? b1 * QUANT4_BLOCK : w->numel;
    float *absmax = xmalloc((b1 - nb0) * sizeof(float));
    read_absmax(st, w, nb0, b0, b1, absmax);
    uint8_t *codes = xmalloc(quant4_code_bytes(e1 - e0));
    read_code_bytes(st, w, e0 / 2, quant4_code_bytes(e1 - e0), codes);
    float *values = xmalloc((e1 - e0) * sizeof(float));
    quant4_dequantize((enum quant4_type)w->type, codes, absmax + (b0 - nb0), e1 - e0, values, DTYPE_F32);
    memcpy(out, values + (first - e0), n * sizeof(float));
    free(values);
    free(codes);
    free(absmax);
}

void hf_bnb_read_q4(struct st_model *st, const struct hf_bnb_weight *w, size_t first, size_t n,
                    const struct quant4_range *out)
{
    if (out->qabsmax && !w->nested_absmax)
        fail_internal("hf_bnb_read_q4: the nested form of a weight stored without double quantization");
    if (out->qabsmax)
        *out->offset = w->offset;
    if (n == 0)
        return;
    if (first % QUANT4_BLOCK || first + n > w->numel)
        fail_internal("hf_bnb_read_q4: [%zu, +%zu) is not whole blocks of a %zu-element weight", first, n, w->numel);
    const size_t b0 = first / QUANT4_BLOCK, b1 = b0 + quant4_blocks(n);
    if (out->qabsmax) { /* bitsandbytes' nested form, as the files hold it */
        st_read_raw(st, w->absmax, b0, b1 - b0, out->qabsmax, NULL, NULL);
        st_read(st, w->nested_absmax, b0 / QUANT4_NESTED_BLOCK, quant4_nested_touched(b0, b1 - b0),
                out->nested_absmax);
    } else {
        const size_t nb0 = w->nested_absmax ? b0 / QUANT4_NESTED_BLOCK * QUANT4_NESTED_BLOCK : b0;
        float *all = xmalloc((b1 - nb0) * sizeof(float));
        read_absmax(st, w, nb0, b0, b1, all);
        memcpy(out->absmax, all + (b0 - nb0), (b1 - b0) * sizeof(float));
        free(all);
    }
    read_code_bytes(st, w, first / 2, quant4_code_bytes(n), out->codes);
}
