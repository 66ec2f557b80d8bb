/*
 * ckpt_tools — `shardlm inspect` and `shardlm export` (see ckpt_tools.h).
 */
#include "ckpt_tools.h"

#include <errno.h>
#include <stdarg.h>
#include <getopt.h>
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <jansson.h>

#include "io/ckpt.h"
#include "run/ckpt_run.h"
#include "io/hf.h"
#include "io/hf_export.h"
#include "io/lora_merge.h"
#include "io/quant_reader.h"
#include "io/peft_export.h"
#include "engine/plan.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/dtype.h"
#include "model/model.h"
#include "core/util.h"
#include "zero/zero.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt_tools writes safetensors data in host order, which must be little-endian"
#endif

/* Elements read from the checkpoint at a time: whole checksummed pieces, so
 * a full read verifies every piece without reading any twice. */
#define TOOLS_PIECE (4 * CKPT_PIECE_ELEMS)

static const char *const state_groups[] = {"master", "adam_m", "adam_v"};
enum { N_STATE_GROUPS = 3 };

/* ------------------------------------------------------------------------ */
/* Shared                                                                    */

static struct ckpt_reader *open_checkpoint(const char *spec, char **path_out)
{
    char *path = ckpt_resolve(spec, spec);
    if (!path)
        fail_input("no checkpoint found at '%s'", spec);
    *path_out = path;
    return ckpt_open(path);
}

static void tensor_shape(const struct tensor_desc *t, size_t shape[2])
{
    shape[0] = (size_t)t->shape[0];
    shape[1] = t->ndim == 2 ? (size_t)t->shape[1] : 0;
}

static void start_single(struct comm *comm, const char *cmd)
{
    comm_init(comm, NULL, NULL);
    if (comm->world != 1)
        fail_input("'shardlm %s' runs as one process, not %d ranks; run it without mpirun/srun", cmd, comm->world);
}

/* ------------------------------------------------------------------------ */
/* inspect                                                                   */

static void usage_inspect(FILE *out)
{
    fprintf(out,
            "usage: shardlm inspect CKPT\n"
            "\n"
            "Summarises a checkpoint (CKPT: a step_*.h5 file, or a checkpoint directory, whose 'latest' is used):\n"
            "step, skipped steps, world size at save, dtype, loss scale, shardlm version, model shape, tensors,\n"
            "parameters and file size; then reads every dataset in full, which verifies every CRC-32C checksum\n"
            "piece. Runs as one process.\n"
            "\n"
            "options:\n"
            "  -h, --help   this text\n"
            "\n"
            "exit status: 0 all datasets verified; 2 bad input (missing, truncated or corrupted checkpoint: the\n"
            "             message names the dataset)\n");
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': usage_inspect(stdout); return EXIT_OK;
        default: usage_inspect(stderr); return EXIT_BAD_INPUT;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "shardlm: error: inspect needs exactly one CKPT; see 'shardlm inspect --help'\n");
        return EXIT_BAD_INPUT;
    }
    struct comm comm;
    start_single(&comm, "inspect");
    char *path = NULL;
    struct ckpt_reader *r = open_checkpoint(argv[optind], &path);

    struct stat st;
    if (stat(path, &st) != 0)
        fail_input("checkpoint '%s': cannot stat: %s", path, strerror(errno));
    struct model m;
    ckpt_run_model(r, path, &m);
    struct config lora_cfg;
    const bool lora = ckpt_run_lora(r, path, &lora_cfg);
    if (lora)
        model_add_lora(&m, &lora_cfg.lora);
    char *dtype = ckpt_attr_str(r, "dtype");
    char *version = ckpt_attr_str(r, "shardlm_version");

    printf("checkpoint: %s\n", path);
    printf("step: %lld\n", (long long)ckpt_attr_i64(r, "step"));
    printf("skipped steps: %lld\n", (long long)ckpt_attr_i64(r, "skipped_steps"));
    printf("samples seen: %lld\n", (long long)ckpt_attr_i64(r, "samples_seen"));
    printf("world size at save: %d\n", ckpt_saved_world(r));
    printf("dtype: %s\n", dtype);
    printf("loss scale: %g\n", ckpt_attr_f64(r, "loss_scale"));
    printf("shardlm version: %s\n", version);
    printf("model: %s, n_layer %d, n_head %d, n_embd %d, n_positions %d, vocab_size %d (wte stored with %d rows)\n",
           m.cfg.type, m.cfg.n_layer, m.cfg.n_head, m.cfg.n_embd, m.cfg.n_positions, m.cfg.vocab_size,
           m.cfg.padded_vocab);
    /* a LoRA checkpoint stores the trained units only: the adapters (and modules_to_save's units) */
    int n_tensors = 0;
    for (int u = 0; u < m.n_units; u++)
        n_tensors += m.units[u].frozen ? 0 : m.units[u].n_tensors;
    size_t trimmed = m.n_params - (size_t)(m.cfg.padded_vocab - m.cfg.vocab_size) * (size_t)m.cfg.n_embd;
    printf("tensors: %d per group (groups master, adam_m, adam_v)\n", n_tensors);
    if (lora) {
        char *source = ckpt_attr_str(r, "base_source"), *sum = ckpt_attr_str(r, "base_checksum");
        printf("LoRA: r %d, alpha / r %g, %d adapted layers, %zu adapter parameters; base %s (checksum %s, not "
               "stored)\n",
               m.lora.r, m.lora.scale, m.lora.n_adapted, model_adapter_params(&m), source, sum);
        free(source);
        free(sum);
    } else {
        printf("parameters: %zu (%zu stored, with the padded wte rows)\n", trimmed, m.n_params);
    }
    printf("file size: %lld bytes\n", (long long)st.st_size);
    fflush(stdout);

    float *buf = xmalloc(TOOLS_PIECE * sizeof *buf);
    int n_datasets = 0;
    for (int g = 0; g < N_STATE_GROUPS; g++) {
        for (int u = 0; u < m.n_units; u++) {
            for (int i = 0; !m.units[u].frozen && i < m.units[u].n_tensors; i++) {
                const struct tensor_desc *t = &m.units[u].tensors[i];
                size_t shape[2];
                tensor_shape(t, shape);
                for (size_t b = 0; b < t->numel; b += TOOLS_PIECE) {
                    size_t n = t->numel - b < TOOLS_PIECE ? t->numel - b : TOOLS_PIECE;
                    ckpt_read(r, state_groups[g], t->name, t->ndim, shape, b, n, buf);
                }
                n_datasets++;
            }
        }
    }
    /* The per-rank state the trainer saves. */
    static const char *const rank_state[] = {"data_position", "rng"};
    uint64_t *rs = xcalloc((size_t)ckpt_saved_world(r), sizeof *rs);
    for (int i = 0; i < 2; i++) {
        ckpt_read_rank_state(r, rank_state[i], 1, rs);
        n_datasets++;
    }
    free(rs);
    free(buf);
    printf("checksum status: all %d datasets verified\n", n_datasets);

    free(dtype);
    free(version);
    model_free(&m);
    if (lora)
        config_free(&lora_cfg);
    ckpt_close(r);
    free(path);
    comm_finalize(&comm);
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* export                                                                    */

static void usage_export(FILE *out)
{
    fprintf(out,
            "usage: shardlm export CKPT [--dtype bf16|fp16|fp32] [--max-shard-size 5GB] [--merge [--base DIR]] OUT\n"
            "\n"
            "Writes the weights of a checkpoint (its fp32 master copy; no optimizer state) under their Hugging Face\n"
            "names (wte.weight, h.0.attn.c_attn.weight, ...) at full shape, converted to the dtype (round to\n"
            "nearest even). wte.weight is written trimmed to (vocab_size, n_embd), as Hugging Face expects; the\n"
            "checkpoint stores it padded to a multiple of 128 rows. CKPT is a step_*.h5 file, or a checkpoint\n"
            "directory, whose 'latest' is used. Runs as one process.\n"
            "\n"
            "OUT by its suffix:\n"
            "  (none)        a Hugging Face model directory, ready for from_pretrained: config.json, the weights in\n"
            "                model.safetensors, or model-0000K-of-0000N.safetensors files of at most --max-shard-size\n"
            "                with model.safetensors.index.json, and the tokenizer files of the directory the run\n"
            "                started from (model.from_pretrained). Under mpirun every rank reads 1/N of every tensor\n"
            "                and writes it at its offset: nothing is gathered. A directory holding another model is\n"
            "                refused.\n"
            "  .safetensors  one safetensors file (dtype F32, F16 or BF16; metadata format=pt)\n"
            "  .h5           plain HDF5: one dataset per tensor at the root; fp32 as 32-bit float, fp16 as IEEE\n"
            "                16-bit float, bf16 as uint16 (the bf16 bits); every dataset has a 'dtype' attribute\n"
            "\n"
            "A LoRA checkpoint (a run with a lora section) exports as a directory only, in the run's dtype unless\n"
            "--dtype says otherwise:\n"
            "  (default)     PEFT's adapter directory, which peft.PeftModel.from_pretrained(base, OUT) loads:\n"
            "                adapter_model.safetensors (the adapters, and the tensors of lora.modules_to_save) and\n"
            "                adapter_config.json\n"
            "  --merge       a Hugging Face model directory of the base with the adapters folded in,\n"
            "                W + (alpha / r) B A (GPT-2's Conv1D weights: the transpose), the base's tensors read\n"
            "                from its directory, lora.modules_to_save's from the checkpoint\n"
            "\n"
            "options:\n"
            "  --dtype DTYPE   bf16, fp16 or fp32 (default fp32; a LoRA checkpoint's: its run's)\n"
            "  --max-shard-size SIZE   largest weight file of a directory export (default 5GB; 5GB = 5e9 bytes,\n"
            "                  5GiB = 2^32 x 1.25)\n"
            "  --merge         (LoRA checkpoints) the base with the adapters folded in, as a Hugging Face directory\n"
            "  --base DIR      (LoRA checkpoints) the base model directory (default: the run's\n"
            "                  model.from_pretrained)\n"
            "  --overwrite     replace an existing OUT file, or a directory holding a model of this shape that\n"
            "                  is not an earlier export of this checkpoint's run (the base model is never\n"
            "                  replaced)\n"
            "  -h, --help      this text\n"
            "\n"
            "exit status: 0 written; 2 bad input (arguments, missing or corrupted checkpoint, unwritable OUT, --merge\n"
            "             of a checkpoint without LoRA, a missing base directory or one of another shape)\n");
}

struct out_tensor {
    const char *name;
    int ndim;
    size_t shape[2];  /* full shape in the checkpoint */
    size_t rows;      /* rows written (wte: vocab_size) */
    size_t numel;     /* elements written */
};

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Reads [0, t->numel) of /master/<name> and converts it into out (dtype dt). */
static void read_converted(struct ckpt_reader *r, const struct out_tensor *t, enum dtype dt, float *tmp, void *out)
{
    size_t esize = (size_t)dtype_size(dt);
    for (size_t b = 0; b < t->numel; b += TOOLS_PIECE) {
        size_t n = t->numel - b < TOOLS_PIECE ? t->numel - b : TOOLS_PIECE;
        ckpt_read(r, "master", t->name, t->ndim, t->shape, b, n, tmp);
        dtype_convert((char *)out + b * esize, dt, tmp, DTYPE_F32, n);
    }
}

/* A growing string for the safetensors header. */
struct sbuf {
    char *s;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0)
            fail_internal("export: formatting the safetensors header failed");
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = 2 * b->cap + (size_t)n + 1;
        char *s = realloc(b->s, b->cap);
        if (!s)
            fail_internal("export: out of memory for the safetensors header");
        b->s = s;
    }
}

static void write_checked(FILE *fp, const void *data, size_t n, const char *path)
{
    if (n && fwrite(data, 1, n, fp) != n)
        fail_input("export: cannot write '%s': %s", path, strerror(errno));
}

static void export_safetensors(struct ckpt_reader *r, const struct out_tensor *ts, int n, enum dtype dt,
                               const char *out, const char *tmp_path)
{
    static const char *const st_names[] = {"F32", "F16", "BF16"};
    size_t esize = (size_t)dtype_size(dt);
    struct sbuf h = {xmalloc(256), 0, 256};
    h.s[0] = 0;
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%zu", ts[i].name, st_names[dt], ts[i].rows);
        if (ts[i].ndim == 2)
            sb_printf(&h, ",%zu", ts[i].shape[1]);
        sb_printf(&h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + ts[i].numel * esize);
        offset += ts[i].numel * esize;
    }
    sb_printf(&h, "}");
    while (h.len % 8 != 0) /* pad with spaces so that the data start 8-byte aligned */
        sb_printf(&h, " ");

    util_remove_on_failure(tmp_path);
    FILE *fp = fopen(tmp_path, "wb");
    if (!fp)
        fail_input("export: cannot create '%s': %s", tmp_path, strerror(errno));
    uint64_t hlen = h.len; /* little-endian host (checked at compile time) */
    write_checked(fp, &hlen, sizeof hlen, tmp_path);
    write_checked(fp, h.s, h.len, tmp_path);
    free(h.s);

    float *tmp = xmalloc(TOOLS_PIECE * sizeof *tmp);
    for (int i = 0; i < n; i++) {
        void *data = xmalloc(ts[i].numel * esize + 1);
        read_converted(r, &ts[i], dt, tmp, data);
        write_checked(fp, data, ts[i].numel * esize, tmp_path);
        free(data);
    }
    free(tmp);
    if (fflush(fp) != 0 || ferror(fp))
        fail_input("export: cannot write '%s': %s", tmp_path, strerror(errno));
    if (fclose(fp) != 0)
        fail_input("export: cannot close '%s': %s", tmp_path, strerror(errno));
    if (rename(tmp_path, out) != 0)
        fail_input("export: cannot rename '%s' to '%s': %s", tmp_path, out, strerror(errno));
    util_keep_file(tmp_path);
}

static void h5_fail(const char *path, const char *what, const char *name)
{
    fail_input("export: cannot %s '%s' in '%s' (HDF5 error). Hint: check the disk space and permissions", what, name,
               path);
}

static void h5_attr_str(hid_t loc, const char *name, const char *value, const char *path)
{
    hid_t type = H5Tcopy(H5T_C_S1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = -1;
    if (type < 0 || space < 0 || H5Tset_size(type, strlen(value) + 1) < 0 ||
        (attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 || H5Awrite(attr, type, value) < 0)
        h5_fail(path, "write attribute", name);
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
}

static void h5_attr_i64(hid_t loc, const char *name, int64_t value, const char *path)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = -1;
    if (space < 0 || (attr = H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        H5Awrite(attr, H5T_NATIVE_INT64, &value) < 0)
        h5_fail(path, "write attribute", name);
    H5Aclose(attr);
    H5Sclose(space);
}

/* IEEE binary16, little-endian (HDF5 1.10 has no predefined half type). */
static hid_t h5_half_type(const char *path)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0 || H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0)
        h5_fail(path, "create the fp16 type for", path);
    return t;
}

static void export_h5(struct ckpt_reader *r, const struct model *m, const struct out_tensor *ts, int n,
                      enum dtype dt, const char *out, const char *tmp_path)
{
    size_t esize = (size_t)dtype_size(dt);
    util_remove_on_failure(tmp_path);
    hid_t file = H5Fcreate(tmp_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0)
        fail_input("export: cannot create HDF5 file '%s'. Hint: check the directory exists and is writable", tmp_path);
    hid_t ftype = dt == DTYPE_F32 ? H5Tcopy(H5T_IEEE_F32LE)
                  : dt == DTYPE_F16 ? h5_half_type(tmp_path)
                                    : H5Tcopy(H5T_STD_U16LE);
    if (ftype < 0)
        h5_fail(tmp_path, "create the element type for", tmp_path);
    h5_attr_str(file, "format", "shardlm-export", tmp_path);
    h5_attr_str(file, "dtype", dtype_name(dt), tmp_path);
    h5_attr_str(file, "model_type", m->cfg.type, tmp_path);
    h5_attr_i64(file, "step", ckpt_attr_i64(r, "step"), tmp_path);
    h5_attr_i64(file, "n_layer", m->cfg.n_layer, tmp_path);
    h5_attr_i64(file, "n_head", m->cfg.n_head, tmp_path);
    h5_attr_i64(file, "n_embd", m->cfg.n_embd, tmp_path);
    h5_attr_i64(file, "n_positions", m->cfg.n_positions, tmp_path);
    h5_attr_i64(file, "vocab_size", m->cfg.vocab_size, tmp_path);

    float *tmp = xmalloc(TOOLS_PIECE * sizeof *tmp);
    for (int i = 0; i < n; i++) {
        void *data = xmalloc(ts[i].numel * esize + 1);
        read_converted(r, &ts[i], dt, tmp, data);
        hsize_t dims[2] = {ts[i].rows, ts[i].ndim == 2 ? ts[i].shape[1] : 0};
        hid_t space = H5Screate_simple(ts[i].ndim, dims, NULL);
        hid_t dset = space < 0 ? -1
                               : H5Dcreate2(file, ts[i].name, ftype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        /* Memory type = file type: the bits are written as converted above. */
        if (dset < 0 || H5Dwrite(dset, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
            h5_fail(tmp_path, "write dataset", ts[i].name);
        h5_attr_str(dset, "dtype", dtype_name(dt), tmp_path);
        H5Dclose(dset);
        H5Sclose(space);
        free(data);
    }
    free(tmp);
    H5Tclose(ftype);
    if (H5Fclose(file) < 0)
        fail_input("export: cannot finish writing '%s' (HDF5 error on close); the disk may be full. Hint: check "
                   "the disk space and permissions",
                   tmp_path);
    if (rename(tmp_path, out) != 0)
        fail_input("export: cannot rename '%s' to '%s': %s", tmp_path, out, strerror(errno));
    util_keep_file(tmp_path);
}

/* What `shardlm export` was asked for. */
struct export_request {
    const char *spec, *out;
    const char *dtype;          /* --dtype; NULL: fp32, or a LoRA checkpoint's own dtype */
    const char *max_shard_size; /* --max-shard-size */
    bool merge;                 /* --merge: the base with the adapters folded in */
    const char *base;           /* --base; NULL: the checkpoint's model.from_pretrained */
    bool overwrite;             /* --overwrite: OUT may replace another model or file */
};

/* The directory that holds path ("." for a bare name). */
static void parent_dir(const char *path, char *out, size_t size)
{
    const char *slash = strrchr(path, '/');
    snprintf(out, size, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
}

/* OUT must not be a model directory the checkpoint was trained from (its
 * model.from_pretrained, --base), nor a file in one, under any name or link:
 * the base's weights would be replaced, and the LoRA checkpoints recorded
 * against it would no longer match. */
static void refuse_base_output(const char *out, const char *pretrained, const char *base_opt)
{
    char parent[CKPT_MAX_PATH];
    parent_dir(out, parent, sizeof parent);
    const char *bases[2] = {pretrained, base_opt};
    const char *what[2] = {"the model directory this checkpoint's run started from (model.from_pretrained)",
                           "the base model directory (--base)"};
    for (int i = 0; i < 2; i++)
        if (bases[i] && bases[i][0] && (util_same_file(out, bases[i], -1) || util_same_file(parent, bases[i], -1)))
            fail_input("export: OUT '%s' is %s '%s', or a file in it: the export would replace the base's weights. "
                       "Hint: name another directory",
                       out, what[i], bases[i]);
}

/* A file OUT that exists is replaced only with --overwrite. */
static void refuse_existing_file(const char *out, bool overwrite)
{
    struct stat st;
    if (!overwrite && stat(out, &st) == 0)
        fail_input("export: OUT '%s' already exists; give --overwrite to replace it, or name another file", out);
}

/* export --merge: the base read must be the one the adapters were trained on:
 * its checksum (zero_hash_source over the base units, as the trainer computes
 * it from the files) the checkpoint's base_checksum. Every rank hashes 1/N. */
static void check_merge_base(const struct model *m, struct ckpt_reader *r, const char *path, const char *base,
                             struct comm *comm, const struct quant_config *quant)
{
    struct hf_source hf;
    hf_source_open(&hf, m, base);
    struct param_source src = {hf_source_read, NULL, &hf, NULL};
    struct quant_reader qr; /* a QLoRA checkpoint's checksum is of the 4-bit values, as its run read them */
    const bool quantize = quant->load_in_4bit && hf.bnb_weights == 0;
    if (quantize) {
        quant_reader_init(&qr, m, quant, hf_source_read, &hf);
        src = (struct param_source){quant_reader_read, NULL, &qr, NULL};
    }
    struct base_hash h;
    zero_hash_source(&h, m, m->n_base_units, &src);
    float *buf = xmalloc(TOOLS_PIECE * sizeof *buf);
    for (int u = 0; u < m->n_base_units; u++) {
        const size_t numel = m->units[u].numel;
        const size_t hi = numel * (size_t)(comm->rank + 1) / (size_t)comm->world;
        for (size_t b = numel * (size_t)comm->rank / (size_t)comm->world; b < hi; b += TOOLS_PIECE)
            h.src.read(h.src.ctx, u, b, hi - b < TOOLS_PIECE ? hi - b : TOOLS_PIECE, buf);
    }
    free(buf);
    if (quantize)
        quant_reader_free(&qr);
    hf_source_close(&hf);
    char sum[24];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)zero_hash_total(&h, comm, comm->rank, comm->world));
    char *want = ckpt_attr_str(r, "base_checksum"), *source = ckpt_attr_str(r, "base_source");
    if (strcmp(sum, want) != 0)
        fail_input("export --merge: LoRA checkpoint '%s' was trained on another base: %s (checksum %s), and the base "
                   "'%s' has checksum %s; give the base it was trained on with --base DIR",
                   path, source, want, base, sum);
    free(want);
    free(source);
}

static enum dtype parse_dtype(const char *name, const char *what)
{
    if (strcmp(name, "fp32") == 0)
        return DTYPE_F32;
    if (strcmp(name, "fp16") == 0)
        return DTYPE_F16;
    if (strcmp(name, "bf16") == 0)
        return DTYPE_BF16;
    fail_input("export: %s '%s' is not one of bf16, fp16, fp32", what, name);
}

/* The dtype of a directory export: --dtype, else a LoRA checkpoint's run's. */
static enum dtype export_dtype(const struct export_request *q, struct ckpt_reader *r, bool lora)
{
    if (q->dtype || !lora)
        return parse_dtype(q->dtype ? q->dtype : "fp32", "--dtype");
    char *name = ckpt_attr_str(r, "dtype");
    enum dtype dt = parse_dtype(name, "the checkpoint's dtype");
    free(name);
    return dt;
}

/* `shardlm export CKPT DIR`: a Hugging Face directory, every rank reading and
 * writing 1/N of every tensor. A LoRA checkpoint gives PEFT's adapter
 * directory, or with --merge the base with its adapters folded in. */
/* A directory OUT must not be a checkpoint directory (its saves and rotation
 * manage what is there), nor look like a file name (weights.bin would
 * silently become a directory). */
static void refuse_dir_output(const char *out)
{
    char latest[CKPT_MAX_PATH + 16];
    snprintf(latest, sizeof latest, "%s/latest", out);
    if (access(latest, F_OK) == 0)
        fail_input("export: OUT '%s' is a checkpoint directory (it has 'latest'); a model exported there would mix "
                   "with the checkpoints. Hint: name another directory, for example %s/hf",
                   out, out);
    static const char *const files[] = {".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npz", ".json", ".safetensor",
                                        ".hdf5"};
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    struct stat st;
    if (lstat(out, &st) == 0) /* there already: a directory, or refused as not one */
        return;
    for (size_t i = 0; dot && (!slash || dot > slash) && i < sizeof files / sizeof files[0]; i++)
        if (strcmp(dot, files[i]) == 0)
            fail_input("export: OUT '%s' ends in '%s', but export writes a directory, a .safetensors or a .h5 file; "
                       "name one of those",
                       out, files[i]);
}

static int export_hf_dir(const struct export_request *q)
{
    refuse_dir_output(q->out);
    double max_file;
    const char *why;
    if (plan_parse_bytes(q->max_shard_size, &max_file, &why) != 0)
        fail_input("export: --max-shard-size '%s': %s", q->max_shard_size, why);
    H5dont_atexit();
    struct comm comm;
    comm_init(&comm, NULL, NULL);
    char *path = NULL;
    struct ckpt_reader *r = open_checkpoint(q->spec, &path);
    struct model m;
    ckpt_run_model(r, path, &m);
    struct config lora_cfg;
    const bool lora = ckpt_run_lora(r, path, &lora_cfg);
    if ((q->merge || q->base) && !lora)
        fail_input("export %s: '%s' is not a LoRA checkpoint (its config has no lora section) but a whole model; "
                   "export it without %s",
                   q->merge ? "--merge" : "--base", path, q->merge ? "--merge" : "--base");
    if (lora)
        model_add_lora(&m, &lora_cfg.lora);
    const enum dtype dt = export_dtype(q, r, lora);
    const char *base = q->base ? q->base : m.cfg.pretrained;
    refuse_base_output(q->out, m.cfg.pretrained, q->base);
    struct lora_merge merge;
    if (q->merge) {
        if (!base[0])
            fail_input("export --merge: checkpoint '%s' names no base model directory (its run had no "
                       "model.from_pretrained); give the base the adapters were trained on with --base DIR",
                       path);
        lora_merge_open(&merge, &m, r, base, q->base ? "--base" : "the checkpoint's model.from_pretrained",
                        &lora_cfg.quant);
        check_merge_base(&m, r, path, base, &comm, &lora_cfg.quant);
    }
    const bool adapters = lora && !q->merge;
    /* the tokenizer files and config.json fields come from the directory the run started from */
    struct stat st;
    const char *src_dir = q->merge ? base : m.cfg.pretrained;
    if (!adapters && src_dir[0] && (stat(src_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        if (comm.rank == 0)
            log_warn("export: the directory checkpoint '%s' started from, '%s', is not there (seen from %s): the "
                     "export gets no tokenizer files or generation_config.json; copy them from the base model",
                     path, src_dir, src_dir[0] == '/' ? "this machine" : "this working directory");
        src_dir = "";
    }
    double t0 = now_seconds();
    struct hf_writer w;
    char ckpt_dir[CKPT_MAX_PATH]; /* the checkpoint's directory: config.json records it */
    parent_dir(path, ckpt_dir, sizeof ckpt_dir);
    if (adapters)
        peft_export_begin(&w, &m, dt, q->out, &comm);
    else
        hf_export_begin(&w, &m, dt, (uint64_t)max_file, q->out, ckpt_dir, q->overwrite, &comm);
    float *tmp = xmalloc(TOOLS_PIECE * sizeof *tmp);
    size_t total = 0;
    for (int u = 0; u < m.n_units; u++)
        for (int i = 0; i < m.units[u].n_tensors; i++) {
            if (!hf_export_writes(&w, u, i))
                continue;
            const struct tensor_desc *t = &m.units[u].tensors[i];
            size_t shape[2], valid = (size_t)t->rows_valid * (size_t)t->shape[1];
            tensor_shape(t, shape);
            total += valid;
            size_t lo = valid * (size_t)comm.rank / (size_t)comm.world;
            size_t hi = valid * (size_t)(comm.rank + 1) / (size_t)comm.world;
            for (size_t b = lo; b < hi; b += TOOLS_PIECE) {
                size_t n = hi - b < TOOLS_PIECE ? hi - b : TOOLS_PIECE;
                if (q->merge)
                    lora_merge_read(&merge, u, i, b, n, tmp);
                else
                    ckpt_read(r, "master", t->name, t->ndim, shape, b, n, tmp);
                hf_export_write(&w, u, i, b, n, tmp);
            }
        }
    free(tmp);
    double written = (double)w.bytes_written, *per_rank = xcalloc((size_t)comm.world, sizeof *per_rank);
    per_rank[comm.rank] = written;
    comm_allgather(&comm, &per_rank[comm.rank], per_rank, 1, COMM_F64, NULL);
    int n_files = w.layout.n_files;
    if (adapters)
        peft_export_end(&w, &lora_cfg.lora, base, &comm);
    else
        hf_export_end(&w, dt, src_dir, &comm);
    if (comm.rank == 0) {
        printf("exported %zu parameters (%s%s) of %s step %lld to %s: %d weight file%s, %.2f s; bytes written per "
               "rank:",
               total, dtype_name(dt), adapters ? ", PEFT adapters" : q->merge ? ", adapters merged into the base" : "",
               path, (long long)ckpt_attr_i64(r, "step"), q->out, n_files, n_files == 1 ? "" : "s",
               now_seconds() - t0);
        for (int k = 0; k < comm.world; k++)
            printf(" %.0f", per_rank[k]);
        printf("\n");
    }
    free(per_rank);
    if (q->merge)
        lora_merge_close(&merge);
    model_free(&m);
    if (lora)
        config_free(&lora_cfg);
    ckpt_close(r);
    free(path);
    comm_finalize(&comm);
    return EXIT_OK;
}

int cmd_export(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dtype", required_argument, NULL, 'd'},
        {"max-shard-size", required_argument, NULL, 'm'},
        {"merge", no_argument, NULL, 'M'},
        {"base", required_argument, NULL, 'b'},
        {"overwrite", no_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct export_request q = {NULL, NULL, NULL, "5GB", false, NULL, false};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': q.dtype = optarg; break;
        case 'm': q.max_shard_size = optarg; break;
        case 'M': q.merge = true; break;
        case 'b': q.base = optarg; break;
        case 'o': q.overwrite = true; break;
        case 'h': usage_export(stdout); return EXIT_OK;
        default: usage_export(stderr); return EXIT_BAD_INPUT;
        }
    }
    if (optind != argc - 2) {
        fprintf(stderr, "shardlm: error: export needs CKPT and OUT; see 'shardlm export --help'\n");
        return EXIT_BAD_INPUT;
    }
    if (q.dtype)
        parse_dtype(q.dtype, "--dtype");
    q.spec = argv[optind];
    q.out = argv[optind + 1];
    const char *spec = q.spec, *out = q.out;
    bool safetensors = ends_with(out, ".safetensors");
    if (!safetensors && !ends_with(out, ".h5"))
        return export_hf_dir(&q);
    if (q.merge || q.base)
        fail_input("export: %s writes a Hugging Face directory, and OUT '%s' names a file; name a directory",
                   q.merge ? "--merge" : "--base", out);
    const enum dtype dt = parse_dtype(q.dtype ? q.dtype : "fp32", "--dtype");
    char tmp_path[CKPT_MAX_PATH];
    if (snprintf(tmp_path, sizeof tmp_path, "%s.tmp", out) >= (int)sizeof tmp_path)
        fail_input("export: OUT path is too long: '%s'", out);

    /* A failed write (a full disk) leaves the file half-closed; HDF5's own
     * clean-up at exit would then crash on it. The .tmp is removed instead. */
    H5dont_atexit();
    struct comm comm;
    start_single(&comm, "export");
    char *path = NULL;
    struct ckpt_reader *r = open_checkpoint(spec, &path);
    /* The export is renamed over OUT at the end: OUT must not be the checkpoint
     * itself (under any name or link), whose optimizer state and resume point
     * would be gone. */
    if (util_same_file(out, path, -1))
        fail_input("export: OUT '%s' is the checkpoint being exported ('%s'); writing the export there would "
                   "destroy it. Hint: name another file",
                   out, path);
    /* nor another training checkpoint, or a name a checkpoint directory's
     * saves and rotation would replace or delete */
    const char *out_base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    if (ckpt_managed_name(out_base))
        fail_input("export: OUT '%s' has a training checkpoint's name (step_N.h5): the export %s. Hint: name it "
                   "differently, for example model.h5",
                   out, access(out, F_OK) == 0 ? "would replace that checkpoint, optimizer state and all"
                                               : "could be taken for one, and --resume auto or checkpoint.keep "
                                                 "would then read or delete it");
    if (ckpt_has_attr(r, "base_checksum"))
        fail_input("export: '%s' is a LoRA checkpoint (adapters, not a whole model); export it as a directory: "
                   "PEFT's adapter files, or the base with the adapters folded in (--merge)",
                   path);
    struct model m;
    ckpt_run_model(r, path, &m);
    refuse_base_output(out, m.cfg.pretrained, NULL);
    refuse_existing_file(out, q.overwrite);

    int n = 0;
    for (int u = 0; u < m.n_units; u++)
        n += m.units[u].n_tensors;
    struct out_tensor *ts = xcalloc((size_t)n, sizeof *ts);
    int k = 0;
    for (int u = 0; u < m.n_units; u++) {
        for (int i = 0; i < m.units[u].n_tensors; i++, k++) {
            const struct tensor_desc *t = &m.units[u].tensors[i];
            ts[k].name = t->name;
            ts[k].ndim = t->ndim;
            tensor_shape(t, ts[k].shape);
            ts[k].rows = (size_t)t->rows_valid; /* wte: vocab_size of padded_vocab */
            if (ts[k].rows == 0 || ts[k].rows > ts[k].shape[0])
                ts[k].rows = ts[k].shape[0];
            ts[k].numel = ts[k].rows * (t->ndim == 2 ? ts[k].shape[1] : 1);
        }
    }
    if (safetensors)
        export_safetensors(r, ts, n, dt, out, tmp_path);
    else
        export_h5(r, &m, ts, n, dt, out, tmp_path);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += ts[i].numel;
    printf("exported %d tensors (%zu parameters, %s) of %s step %lld to %s\n", n, total, dtype_name(dt), path,
           (long long)ckpt_attr_i64(r, "step"), out);

    free(ts);
    model_free(&m);
    ckpt_close(r);
    free(path);
    comm_finalize(&comm);
    return EXIT_OK;
}
