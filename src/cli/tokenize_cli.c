#include "tokenize_cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "core/util.h"

/* Room for the library's one-line errors. */
#define TOKENIZE_ERR_BYTES 1024

struct tokenize_options {
    int decode, add_special, skip_special, stream, json;
    long context; /* --stream: ids of context before the printed ones */
};

static void usage_tokenize(FILE *out)
{
    fprintf(out,
            "usage: shardlm tokenize TOKENIZER_JSON [options] [FILE|- ...]\n"
            "\n"
            "Encodes each FILE (standard input without one, or for -), UTF-8 text, with a Hugging Face\n"
            "tokenizer.json as Python's tokenizers does (Tokenizer.encode(text).ids) and prints its ids as a\n"
            "JSON array on a line of its own.\n"
            "\n"
            "options:\n"
            "  --decode         each FILE holds a JSON array of ids: print their text (Tokenizer.decode), as it\n"
            "                   is, without a newline added\n"
            "  --json           with --decode: print each text as a JSON string on a line of its own\n"
            "  --no-special     encode without the post-processor's special tokens (add_special_tokens=False)\n"
            "  --skip-special   decode without the special tokens (skip_special_tokens=True)\n"
            "  --stream         with --decode: decode id by id as generation prints text and print the pieces\n"
            "                   as a JSON array of strings, one line per FILE\n"
            "  --context N      with --stream: the first N ids are the context (the prompt), not printed\n"
            "  -h, --help       this text\n"
            "\n"
            "Supported: BPE models (GPT-2, Llama 2, Llama 3 kinds); anything else is refused, naming it.\n"
            "exit status: 0 done; 2 bad input (tokenizer, text, ids, arguments)\n");
}

/* All of path (or standard input for NULL or "-"), NUL-terminated. */
static char *read_input(const char *path, size_t *len)
{
    int is_stdin = !path || strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f)
        fail_input("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f))
        fail_input("cannot read '%s': %s", is_stdin ? "standard input" : path, strerror(errno));
    if (!is_stdin)
        fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static void encode(const struct tokenizer *tok, const char *what, const char *text, size_t len, int add_special)
{
    char err[TOKENIZE_ERR_BYTES];
    int32_t *ids;
    size_t n;
    if (tokenizer_encode(tok, text, len, add_special, &ids, &n, err, sizeof err) != 0)
        fail_input("%s: %s", what, err);
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++)
        printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
}

/* The ids of a JSON array, each checked against the tokenizer's range. */
static int32_t *parse_ids(const struct tokenizer *tok, const char *what, const char *text, size_t len, size_t *n)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!json_is_array(root))
        fail_input("%s: %s%s: --decode reads a JSON array of token ids, like [1, 2, 3]", what,
                   root ? "not a JSON array" : "not valid JSON: ", root ? "" : jerr.text);
    *n = json_array_size(root);
    int32_t *ids = xcalloc(*n + 1, sizeof *ids);
    size_t vocab = tokenizer_vocab_size(tok), i;
    json_t *v;
    json_array_foreach(root, i, v) {
        if (!json_is_integer(v))
            fail_input("%s: element %zu is not an integer, not a token id: this tokenizer has ids 0 to %zu", what, i,
                       vocab - 1);
        if (json_integer_value(v) < 0 || (size_t)json_integer_value(v) >= vocab)
            fail_input("%s: element %zu is %lld, out of range: this tokenizer has ids 0 to %zu (%zu tokens)", what,
                       i, (long long)json_integer_value(v), vocab - 1, vocab);
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(root);
    return ids;
}

static void decode(const struct tokenizer *tok, const char *what, const char *text, size_t len,
                  const struct tokenize_options *o)
{
    size_t n;
    int32_t *ids = parse_ids(tok, what, text, len, &n);
    if (!o->stream) {
        size_t out_len;
        char *out = tokenizer_decode(tok, ids, n, o->skip_special, &out_len);
        if (o->json) {
            json_t *s = json_stringn(out, out_len);
            char *dump = json_dumps(s, JSON_ENCODE_ANY);
            if (!dump)
                fail_internal("the decoder made text that is not UTF-8 (%s)", what);
            puts(dump);
            free(dump);
            json_decref(s);
        } else {
            fwrite(out, 1, out_len, stdout);
        }
        free(out);
        free(ids);
        return;
    }
    size_t context = (size_t)o->context < n ? (size_t)o->context : n;
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, tok, ids, context, o->skip_special);
    json_t *pieces = json_array();
    for (size_t i = context; i <= n; i++) {
        size_t piece_len;
        const char *piece = i < n ? tokenizer_stream_push(&st, ids[i], &piece_len)
                                  : tokenizer_stream_finish(&st, &piece_len);
        json_t *s = json_stringn(piece, piece_len);
        if (!s)
            fail_internal("the stream decoder handed out a piece that is not UTF-8 (after id %zu)", i);
        json_array_append_new(pieces, s);
    }
    char *dump = json_dumps(pieces, JSON_COMPACT);
    puts(dump);
    free(dump);
    json_decref(pieces);
    tokenizer_stream_free(&st);
    free(ids);
}

int cmd_tokenize(int argc, char **argv)
{
    static const struct option opts[] = {
        {"decode", no_argument, NULL, 'd'},       {"no-special", no_argument, NULL, 'n'},
        {"skip-special", no_argument, NULL, 's'}, {"stream", no_argument, NULL, 'S'},
        {"context", required_argument, NULL, 'c'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    struct tokenize_options o = {.add_special = 1};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': o.decode = 1; break;
        case 'n': o.add_special = 0; break;
        case 's': o.skip_special = 1; break;
        case 'S': o.stream = 1; break;
        case 'j': o.json = 1; break;
        case 'c': {
            char *end;
            o.context = strtol(optarg, &end, 10);
            if (*optarg == 0 || *end || o.context < 0)
                fail_input("--context '%s' is not a count of ids", optarg);
            break;
        }
        case 'h': usage_tokenize(stdout); return EXIT_OK;
        default: usage_tokenize(stderr); return EXIT_BAD_INPUT;
        }
    }
    if (argc - optind < 1) {
        fprintf(stderr, "shardlm: error: tokenize needs TOKENIZER_JSON; see 'shardlm tokenize --help'\n");
        return EXIT_BAD_INPUT;
    }
    if ((o.stream || o.json) && !o.decode)
        fail_input("--%s is for decoding: give it with --decode", o.stream ? "stream" : "json");
    char err[TOKENIZE_ERR_BYTES];
    struct tokenizer *tok = tokenizer_load(argv[optind], err, sizeof err);
    if (!tok)
        fail_input("%s", err);
    int n_inputs = argc - optind - 1;
    for (int k = 0; k < (n_inputs ? n_inputs : 1); k++) {
        const char *path = n_inputs ? argv[optind + 1 + k] : NULL;
        const char *what = path && strcmp(path, "-") != 0 ? path : "standard input";
        size_t len;
        char *text = read_input(path, &len);
        if (o.decode)
            decode(tok, what, text, len, &o);
        else
            encode(tok, what, text, len, o.add_special);
        free(text);
    }
    tokenizer_free(tok);
    return EXIT_OK;
}
