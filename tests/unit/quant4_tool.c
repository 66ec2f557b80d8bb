/*
 * quant4_tool — src/core/quant4.c from the command line, for tests/t_quant4.py
 * (which checks it against bitsandbytes 0.50). Built and run with the unit
 * tests: without arguments it checks the module on itself.
 *
 *   quant4_tool quantize TYPE DTYPE NESTED SHARDS IN OUT
 *       TYPE nf4|fp4, DTYPE f32|f16|bf16, NESTED 0|1. Reads the raw elements
 *       of IN (DTYPE, little-endian), quantizes them as SHARDS ranks would
 *       (each its own range of whole blocks; with NESTED, of whole nested
 *       blocks; the offset from every range's absmax), and writes OUT.codes
 *       (packed bytes), OUT.absmax (fp32), with NESTED OUT.qabsmax (bytes),
 *       OUT.nested_absmax (fp32) and OUT.offset (one fp32), and OUT.deq: the
 *       tensor dequantized to DTYPE (through the nested statistics if NESTED).
 */
#include "check.h"
#include "core/quant4.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

static enum dtype parse_dtype(const char *s)
{
    if (strcmp(s, "f32") == 0)
        return DTYPE_F32;
    if (strcmp(s, "f16") == 0)
        return DTYPE_F16;
    if (strcmp(s, "bf16") == 0)
        return DTYPE_BF16;
    fail_input("quant4_tool: unknown dtype '%s'; use f32, f16 or bf16", s);
}

static void *read_all(const char *path, size_t *bytes)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_input("quant4_tool: cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *bytes = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = xmalloc(*bytes ? *bytes : 1);
    if (fread(buf, 1, *bytes, f) != *bytes)
        fail_input("quant4_tool: short read of %s", path);
    fclose(f);
    return buf;
}

static void write_all(const char *prefix, const char *suffix, const void *buf, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, bytes, f) != bytes || fclose(f) != 0)
        fail_input("quant4_tool: cannot write %s", path);
}

struct quantized {
    uint8_t *codes;       /* (n + 1) / 2 */
    float *absmax;        /* blocks */
    uint8_t *qabsmax;     /* blocks, nested only */
    float *nested_absmax; /* nested blocks */
    float offset;
};

/* Quantizes n elements as `shards` ranks would: range r covers whole blocks
 * (whole nested blocks when nested), the last range the rest. */
static void quantize_sharded(enum quant4_type type, const void *src, enum dtype dt, size_t n, int nested,
                             int shards, struct quantized *q)
{
    const size_t blocks = quant4_blocks(n);
    q->codes = xcalloc(quant4_code_bytes(n) + 1, 1);
    q->absmax = xcalloc(blocks + 1, sizeof(float));
    q->qabsmax = xcalloc(blocks + 1, 1);
    q->nested_absmax = xcalloc(quant4_nested_blocks(blocks) + 1, sizeof(float));
    const size_t unit = nested ? (size_t)QUANT4_BLOCK * QUANT4_NESTED_BLOCK : QUANT4_BLOCK;
    const size_t units = (n + unit - 1) / unit;
    const size_t per_shard = (units + (size_t)shards - 1) / (size_t)shards * unit;
    for (int r = 0; r < shards; r++) {
        const size_t begin = (size_t)r * per_shard;
        if (begin >= n)
            break;
        const size_t end = begin + per_shard < n ? begin + per_shard : n;
        quant4_quantize(type, (const char *)src + begin * (size_t)dtype_size(dt), dt, end - begin,
                        q->codes + begin / 2, q->absmax + begin / QUANT4_BLOCK);
    }
    if (!nested)
        return;
    q->offset = quant4_nested_offset(q->absmax, blocks); /* every rank, from the gathered absmax */
    for (int r = 0; r < shards; r++) {
        const size_t begin = (size_t)r * per_shard / QUANT4_BLOCK;
        if (begin >= blocks)
            break;
        const size_t end = begin + per_shard / QUANT4_BLOCK < blocks ? begin + per_shard / QUANT4_BLOCK : blocks;
        quant4_nested_quantize(q->absmax + begin, end - begin, q->offset, q->qabsmax + begin,
                               q->nested_absmax + begin / QUANT4_NESTED_BLOCK);
    }
}

static int tool_quantize(char **argv)
{
    const int type = quant4_type_parse(argv[0]);
    if (type < 0)
        fail_input("quant4_tool: unknown type '%s'; use nf4 or fp4", argv[0]);
    const enum dtype dt = parse_dtype(argv[1]);
    const int nested = atoi(argv[2]), shards = atoi(argv[3]);
    size_t bytes;
    void *src = read_all(argv[4], &bytes);
    const size_t n = bytes / (size_t)dtype_size(dt), blocks = quant4_blocks(n);
    struct quantized q;
    quantize_sharded((enum quant4_type)type, src, dt, n, nested, shards, &q);
    write_all(argv[5], "codes", q.codes, quant4_code_bytes(n));
    write_all(argv[5], "absmax", q.absmax, blocks * sizeof(float));
    float *absmax = q.absmax;
    if (nested) {
        write_all(argv[5], "qabsmax", q.qabsmax, blocks);
        write_all(argv[5], "nested_absmax", q.nested_absmax, quant4_nested_blocks(blocks) * sizeof(float));
        write_all(argv[5], "offset", &q.offset, sizeof(float));
        absmax = xmalloc(blocks * sizeof(float));
        quant4_nested_dequantize(q.qabsmax, q.nested_absmax, q.offset, 0, blocks, absmax);
    }
    void *deq = xmalloc(n * (size_t)dtype_size(dt) + 1);
    quant4_dequantize((enum quant4_type)type, q.codes, absmax, n, deq, dt);
    write_all(argv[5], "deq", deq, n * (size_t)dtype_size(dt));
    return 0;
}

/* The module on itself: table values come back exactly; a range's bytes do
 * not depend on how the tensor is split; the pad nibble; the offset's sum. */
static int self_check(void)
{
    for (int t = 0; t < 2; t++) {
        const enum quant4_type type = (enum quant4_type)t;
        const float *table = quant4_table(type);
        /* Each block holds every code's value times 3 (absmax 3): exact round trip. */
        enum { N = 4 * QUANT4_BLOCK };
        float x[N], back[N];
        for (int i = 0; i < N; i++)
            x[i] = table[(i * 7 + i / QUANT4_BLOCK) % 16] * 3.0f;
        for (int b = 0; b < N / QUANT4_BLOCK; b++)
            x[b * QUANT4_BLOCK + 5] = 3.0f; /* the block's absmax, whatever the pattern */
        uint8_t codes[N / 2];
        float absmax[N / QUANT4_BLOCK];
        quant4_quantize(type, x, DTYPE_F32, N, codes, absmax);
        quant4_dequantize(type, codes, absmax, N, back, DTYPE_F32);
        int same = 1;
        for (int i = 0; i < N; i++)
            same &= back[i] == x[i];
        char name[64];
        snprintf(name, sizeof name, "quant4.%s.table_round_trip", quant4_type_name(type));
        CHECK(name, same && absmax[0] == 3.0f, "a table value times the absmax did not come back");
        /* shards: 1 against 3 ranks, odd length, nested */
        enum { M = 3 * QUANT4_BLOCK * QUANT4_NESTED_BLOCK + 77 };
        float *y = xmalloc(M * sizeof(float));
        uint64_t state = 42;
        for (int i = 0; i < M; i++)
            y[i] = rng_normal(&state) * (1.0f + (float)(i % 1000) / 100.0f);
        struct quantized one, three;
        quantize_sharded(type, y, DTYPE_F32, M, 1, 1, &one);
        quantize_sharded(type, y, DTYPE_F32, M, 1, 3, &three);
        const size_t blocks = quant4_blocks(M);
        snprintf(name, sizeof name, "quant4.%s.shards_equal", quant4_type_name(type));
        CHECK(name,
              memcmp(one.codes, three.codes, quant4_code_bytes(M)) == 0 &&
                  memcmp(one.absmax, three.absmax, blocks * sizeof(float)) == 0 &&
                  memcmp(one.qabsmax, three.qabsmax, blocks) == 0 && one.offset == three.offset &&
                  memcmp(one.nested_absmax, three.nested_absmax, quant4_nested_blocks(blocks) * sizeof(float)) == 0,
              "3 ranks' bytes differ from 1 rank's");
        /* the odd tensor's last low nibble is the code of 0 */
        const uint8_t zero_code = type == QUANT4_NF4 ? 7 : 0;
        snprintf(name, sizeof name, "quant4.%s.pad_nibble", quant4_type_name(type));
        CHECK(name, (one.codes[M / 2] & 0x0f) == zero_code, "pad nibble %d", one.codes[M / 2] & 0x0f);
        free(y);
    }
    /* Fewer than 8 values: plain left-to-right sums of 4 accumulators. */
    const float few[5] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    CHECK("quant4.offset_small", quant4_nested_offset(few, 5) == 3.0f, "got %g", quant4_nested_offset(few, 5));
    CHECK("quant4.parse", quant4_type_parse("nf4") == QUANT4_NF4 && quant4_type_parse("fp4") == QUANT4_FP4 &&
                              quant4_type_parse("int4") == -1, "nf4/fp4/int4");
    return check_status();
}

int main(int argc, char **argv)
{
    if (argc == 1)
        return self_check();
    if (argc == 8 && strcmp(argv[1], "quantize") == 0)
        return tool_quantize(argv + 2);
    fprintf(stderr, "usage: quant4_tool [quantize TYPE DTYPE NESTED SHARDS IN OUT]\n");
    return 2;
}
