#include "hf_export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "hf.h"
#include "core/util.h"

/* The export in progress (rank 0): the checkpoint directory it comes from, as
 * an absolute path, and whether it may replace another model of the shape. */
static char export_origin[CKPT_MAX_PATH];
static bool export_overwrite;

static void refuse_other_model(const struct model *m, const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (access(path, F_OK) == 0) /* transformers would load the adapters named there instead */
        fail_input("export: '%s' holds PEFT adapters (adapter_config.json); a Hugging Face model must not stand "
                   "beside them: export into a new or empty directory",
                   dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) != 0)
        return;
    const char *key;
    long long have, want;
    int differs = hf_config_differs(m, dir, &key, &have, &want);
    if (differs < 0)
        fail_input("export: '%s' holds a config.json that is not a model's; export into a new or empty directory",
                   dir);
    if (differs)
        fail_input("export: '%s' already holds another model (config.json's %s is %lld, this checkpoint's "
                   "%lld); export into a new or empty directory",
                   dir, key, have, want);
    json_t *cfg = json_load_file(path, 0, NULL);
    const char *from = json_string_value(json_object_get(cfg, HF_ORIGIN_KEY));
    const bool own = from && export_origin[0] && strcmp(from, export_origin) == 0;
    if (!own && !export_overwrite) {
        char shown[CKPT_MAX_PATH + 64];
        snprintf(shown, sizeof shown, from ? "an export of '%s'" : "not an export of shardlm's", from ? from : "");
        json_decref(cfg);
        fail_input("export: '%s' already holds a model of this shape (%s), not an earlier export of this "
                   "checkpoint's run ('%s'); export into a new or empty directory, or give --overwrite to replace it",
                   dir, shown, export_origin);
    }
    json_decref(cfg);
}

/* Rank 0: DIR exists and is a directory. */
static void make_dir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fail_input("export: cannot create directory '%s': %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        fail_input("export: '%s' is not a directory", dir);
}

void hf_writer_open(struct hf_writer *w, const struct model *m, enum dtype dt, const struct hf_writer_spec *spec,
                    const char *dir, struct comm *comm)
{
    memset(w, 0, sizeof *w);
    w->m = m;
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    if (comm->rank == 0) {
        make_dir(dir);
        spec->check_dir(m, dir);
    }
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        n += m->units[u].n_tensors;
    struct st_out *outs = xcalloc((size_t)n, sizeof *outs);
    char (*names)[ST_MAX_NAME] = xcalloc((size_t)n, sizeof *names);
    w->first = xcalloc((size_t)n, sizeof *w->first);
    w->elem0 = xcalloc((size_t)n, sizeof *w->elem0);
    int k = 0, written = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_tensors; i++, k++) {
            const struct tensor_desc *t = &m->units[u].tensors[i];
            w->first[k] = -1;
            if (!spec->name(m, u, i, names[written], sizeof names[written]))
                continue;
            /* a fused part (Phi-3's q|k|v, gate|up) is written into the whole its first part opened */
            char whole[ST_MAX_NAME];
            int row0 = 0, rows = t->rows_valid;
            if (hf_fused_part(m, t, whole, sizeof whole, &row0, &rows) && row0 > 0 && written > 0 &&
                strcmp(names[written - 1], names[written]) == 0) {
                w->first[k] = written - 1;
                w->elem0[k] = (size_t)row0 * (size_t)t->shape[1];
                continue;
            }
            outs[written] = (struct st_out){names[written], t->ndim, {rows, t->ndim == 2 ? t->shape[1] : 0}};
            w->first[k] = written++;
        }
    st_layout_plan(&w->layout, outs, written, dt, spec->max_file);
    if (w->layout.n_files == 1 && spec->file_name)
        snprintf(w->layout.file_names[0], sizeof w->layout.file_names[0], "%s", spec->file_name);
    free(outs);
    free(names);
    comm_barrier(comm); /* the directory exists and holds nothing this export must not mix with */
    if (comm->rank == 0)
        st_create(&w->layout, dir, 1, &w->files);
    comm_barrier(comm);
    if (comm->rank != 0)
        st_create(&w->layout, dir, 0, &w->files);
}

/* A model's tensors under their Hugging Face names; LoRA's adapters are no part of it. */
static bool model_tensor_name(const struct model *m, int u, int t, char *out, size_t cap)
{
    if (model_is_adapter(m, u))
        return false;
    int row0, rows;
    if (!hf_fused_part(m, &m->units[u].tensors[t], out, cap, &row0, &rows))
        hf_tensor_name(m, &m->units[u].tensors[t], 1, out, cap);
    return true;
}

void hf_export_begin(struct hf_writer *w, const struct model *m, enum dtype dt, uint64_t max_file, const char *dir,
                     const char *ckpt_dir, bool overwrite, struct comm *comm)
{
    char *abs = ckpt_dir ? realpath(ckpt_dir, NULL) : NULL;
    snprintf(export_origin, sizeof export_origin, "%s", abs ? abs : "");
    free(abs);
    export_overwrite = overwrite;
    const struct hf_writer_spec spec = {NULL, max_file, model_tensor_name, refuse_other_model};
    hf_writer_open(w, m, dt, &spec, dir, comm);
}

/* Model tensor t of unit u as the unit-major index of w->first. */
static int model_tensor_index(const struct model *m, int u, int t)
{
    int k = 0;
    for (int v = 0; v < u; v++)
        k += m->units[v].n_tensors;
    return k + t;
}

bool hf_export_writes(const struct hf_writer *w, int u, int t)
{
    return w->first[model_tensor_index(w->m, u, t)] >= 0;
}

void hf_export_write(struct hf_writer *w, int u, int t, size_t begin, size_t count, const float *src)
{
    const int k = w->first[model_tensor_index(w->m, u, t)];
    if (k < 0)
        return;
    const struct tensor_desc *td = &w->m->units[u].tensors[t];
    size_t valid = (size_t)td->rows_valid * (size_t)td->shape[1];
    if (begin >= valid)
        return;
    if (begin + count > valid)
        count = valid - begin;
    st_write(&w->layout, &w->files, k, w->elem0[model_tensor_index(w->m, u, t)] + begin, count, src);
    w->bytes_written += (uint64_t)count * (uint64_t)dtype_size(w->layout.dtype);
}

void hf_export_write_named(struct hf_writer *w, const char *name, size_t begin, size_t count, const float *src)
{
    int u, t;
    if (!model_find_tensor(w->m, name, &u, &t))
        fail_internal("export: the model has no tensor '%s'", name);
    hf_export_write(w, u, t, begin, count, src);
}

/* Whether every real in j reads back as the same double when printed with
 * digits significant digits. */
static bool reals_round_trip(const json_t *j, int digits)
{
    if (json_is_real(j)) {
        char text[48];
        snprintf(text, sizeof text, "%.*g", digits, json_real_value(j));
        return strtod(text, NULL) == json_real_value(j);
    }
    const char *key;
    size_t i;
    json_t *v;
    if (json_is_object(j))
        json_object_foreach((json_t *)j, key, v) if (!reals_round_trip(v, digits)) return false;
    if (json_is_array(j))
        json_array_foreach(j, i, v) if (!reals_round_trip(v, digits)) return false;
    return true;
}

void hf_write_json(const char *path, json_t *j)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* The fewest digits (15 to 17) at which every number reads back exactly, so
     * that 1e-05 is written 1e-05, as Python's json writes it, and not
     * 1.0000000000000001e-05 (jansson's 17 digits): the same value either way. */
    int digits = 15;
    while (digits < 17 && !reals_round_trip(j, digits))
        digits++;
    if (json_dump_file(j, tmp, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits)) != 0)
        fail_input("export: cannot write '%s': %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0)
        fail_input("export: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
}

void hf_writer_close(struct hf_writer *w, void (*publish)(void *ctx, const char *dir), void *ctx, struct comm *comm)
{
    st_close_files(&w->layout, &w->files);
    comm_barrier(comm);
    if (comm->rank == 0) {
        st_publish(&w->layout, w->dir);
        publish(ctx, w->dir);
    }
    comm_barrier(comm);
    st_layout_free(&w->layout);
    free(w->first);
    free(w->elem0);
    w->elem0 = NULL;
    w->first = NULL;
}

struct model_files {
    const struct model *m;
    enum dtype dt;
    const char *src_dir;
};

/* The model's files beside its weights: the tokenizer's, then config.json last. */
static void publish_model(void *ctx, const char *dir)
{
    const struct model_files *f = ctx;
    if (f->src_dir && f->src_dir[0])
        hf_copy_tokenizer(f->src_dir, dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = hf_config_json(f->m, f->dt, f->src_dir);
    /* the checkpoint directory it was exported from: a later export of the same run may replace it */
    if (export_origin[0])
        json_object_set_new(cfg, HF_ORIGIN_KEY, json_string(export_origin));
    else
        json_object_del(cfg, HF_ORIGIN_KEY);
    hf_write_json(path, cfg);
    json_decref(cfg);
}

void hf_export_end(struct hf_writer *w, enum dtype dt, const char *src_dir, struct comm *comm)
{
    struct model_files f = {w->m, dt, src_dir};
    hf_writer_close(w, publish_model, &f, comm);
}
