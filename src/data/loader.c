#include "loader.h"

#include "core/util.h"

#include <string.h>

void loader_open(struct loader *l, const struct config *cfg, const char *path, bool train, const char *tokenizer_json,
                 const char *what)
{
    memset(l, 0, sizeof *l);
    l->samples = samples_is_sample_file(path);
    l->T = cfg->data.seq_len;
    l->what = what;
    if (!l->samples) {
        dataset_open(&l->bin, path, cfg->data.seq_len, cfg->model.vocab_size, train && cfg->data.shuffle,
                     cfg->train.seed, what);
        return;
    }
    struct sample_opts o = {
        .max_len = cfg->data.seq_len,
        .pad_multiple = cfg->data.pad_multiple,
        .truncate = cfg->data.truncate,
        .packing = cfg->data.packing,
        .shuffle = train && cfg->data.shuffle,
        .group_by_length = train && cfg->data.group_by_length,
        .seed = cfg->train.seed,
        .step_units = cfg->train_batch_size,
        .vocab_size = cfg->model.vocab_size,
        .tokenizer_json = tokenizer_json,
        .allow_tokenizer_mismatch = cfg->data.allow_tokenizer_mismatch,
        .pairs = cfg->dpo.enabled,
    };
    samples_open(&l->smp, path, &o, what);
}

void loader_close(struct loader *l)
{
    if (l->samples)
        samples_close(&l->smp);
    else
        dataset_close(&l->bin);
}

int loader_rows(const struct loader *l, int B)
{
    return l->samples ? B * samples_lanes(&l->smp) : B;
}

uint64_t loader_units(struct loader *l)
{
    return l->samples ? samples_epoch_units(&l->smp) : l->bin.n_windows;
}

struct sample_batch loader_batch(struct loader *l, uint64_t first, int B)
{
    if (l->samples)
        return samples_batch(&l->smp, first, B);
    uint64_t n = (uint64_t)B * (uint64_t)l->T;
    return (struct sample_batch){l->T, n, n, 0};
}

int loader_read(struct loader *l, uint64_t first, int B, int32_t *inputs, int32_t *targets, int32_t *positions)
{
    if (!l->samples) {
        dataset_read_batch(&l->bin, first, B, inputs, targets);
        return l->T;
    }
    int T = samples_batch(&l->smp, first, B).T;
    samples_read_batch(&l->smp, first, B, T, inputs, targets, positions);
    return T;
}

struct sample_batch loader_step(struct loader *l, uint64_t first, int B, int accum, int world, uint64_t *slots)
{
    struct sample_batch sum = {0, 0, 0, 0};
    *slots = 0;
    for (int m = 0; m < accum; m++)
        for (int r = 0; r < world; r++) {
            struct sample_batch b = loader_batch(l, first + ((uint64_t)m * world + (uint64_t)r) * (uint64_t)B, B);
            sum.real += b.real;
            sum.trained += b.trained;
            sum.pairs += b.pairs;
            *slots += (uint64_t)loader_rows(l, B) * (uint64_t)b.T;
            sum.T = b.T > sum.T ? b.T : sum.T;
        }
    return sum;
}

bool loader_has_file(const struct loader *l, const char *out, const char **name)
{
    if (l->samples) {
        *name = l->smp.path;
        return util_same_file(out, l->smp.path, -1);
    }
    for (int i = 0; i < l->bin.n_files; i++)
        if (util_same_file(out, NULL, l->bin.files[i].fd)) {
            *name = l->bin.files[i].path;
            return true;
        }
    return false;
}
