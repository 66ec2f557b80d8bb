/*
 * tokenizer — Hugging Face tokenizer.json in C, with the ids of the Python
 * `tokenizers` package (0.23, what transformers 5 runs; 0.19 where the two
 * agree): Tokenizer.encode(text, add_special_tokens).ids
 * and Tokenizer.decode(ids, skip_special_tokens), for the places where shardlm
 * itself needs text (generation, evaluation). Data preparation keeps using
 * Python's tokenizers (tools/prepare_data.py); this reader must agree with it.
 *
 * The pipeline, as tokenizers runs it:
 *   1. added tokens: the raw text is split on the added tokens that are not
 *      `normalized` (leftmost, longest first; lstrip/rstrip/single_word as
 *      tokenizers), then each remaining piece is normalized and split on the
 *      `normalized` added tokens;
 *   2. normalizer: null, Prepend, Replace, or a Sequence of them;
 *   3. pre_tokenizer: null, ByteLevel, Split, Metaspace, or a Sequence;
 *   4. model: BPE (merges by rank, byte_fallback, unk_token, fuse_unk,
 *      ignore_merges), each pre-token merged in O(n log n) with a min-heap;
 *   5. post_processor (when add_special): null, ByteLevel (no change to the
 *      ids), TemplateProcessing for one sequence, or a Sequence of them.
 * Decoding: the tokens of the ids (unknown ids skipped, special ones too with
 * skip_special; a `normalized` added token as the normalizers write it, e.g.
 * Llama 2's "▁<extra_0>", which tokenizers >= 0.20 decodes, where 0.19 took its
 * content), then the decoder: ByteLevel, Metaspace, or a Sequence of
 * Replace, ByteFallback, Fuse, Strip (and those two); without a decoder the
 * tokens joined by spaces. Regexes are Oniguruma's (tokenizers' engine), run
 * with PCRE2 after a translation of what the two dialects spell differently
 * (tokenizer_regex.c), their general categories widened to Unicode 16 (as
 * tokenizers 0.23 has them) by utf8proc and unicode_newer.h over PCRE2
 * 10.42's Unicode 14 tables (tokenizer_unicode.c); scripts, Emoji and
 * Other_Alphabetic keep Unicode 14; Punctuation (tokenizers' Unicode 8
 * tables) splits the punctuation of Unicode 9 to 14, which tokenizers does
 * not (README, "Unicode tables"). Anything else (WordPiece, Unigram, NFKC, BPE dropout,
 * continuing_subword_prefix, ...) is refused at load, naming what it is.
 * truncation and padding are ignored: a caller wants the whole text.
 *
 * Errors are one line "PATH: what; what to do", written into the caller's
 * err buffer; the library never exits (allocation failure aside, which ends
 * the process as everywhere in shardlm, util.h).
 *
 * A loaded tokenizer is read-only: any number of threads may encode and
 * decode with it at once. Callers: tokenize_cli.c (shardlm tokenize) and
 * generation.
 */
#ifndef SHARDLM_TOKENIZER_H
#define SHARDLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* Loads path (a tokenizer.json). Also reads tokenizer_config.json beside it
 * when there is one, for bos_token / eos_token. NULL on failure, with the
 * reason in err. */
struct tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(struct tokenizer *tok);

/* Encodes text[0, len) (UTF-8; NUL bytes are text like any other) to the ids
 * of tokenizers' encode(text, add_special_tokens=add_special): *ids is
 * malloc'd (the caller frees it; NULL when *n is 0). Returns 0, or -1 with err
 * filled: invalid UTF-8 (Python's str cannot hold it, so tokenizers never sees
 * it; the message gives the byte offset), an unk_token missing from the
 * vocabulary where one is needed, a regex failing on this text. */
int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, int add_special, int32_t **ids,
                     size_t *n, char *err, size_t errlen);

/* tokenizers' decode(ids, skip_special_tokens=skip_special): a malloc'd,
 * NUL-terminated UTF-8 string; *len (when len is not NULL) its bytes, which
 * may include NUL. Ids without a token are skipped, as tokenizers does (check
 * them with tokenizer_id_to_token first where that matters). Bytes that do not
 * form UTF-8 (a byte-level id sequence cut in a character) come out as U+FFFD,
 * as in tokenizers. */
char *tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, int skip_special, size_t *len);

/* The id of a token (an added token's or the model's), -1 if none. */
int32_t tokenizer_token_to_id(const struct tokenizer *tok, const char *token);
/* The token of an id (not NUL-terminated: *len bytes), NULL if none. */
const char *tokenizer_id_to_token(const struct tokenizer *tok, int32_t id, size_t *len);
/* 1 if id is a special added token (what skip_special drops). */
int tokenizer_is_special(const struct tokenizer *tok, int32_t id);
/* One more than the largest id, added tokens included. */
size_t tokenizer_vocab_size(const struct tokenizer *tok);
/* BOS: tokenizer_config.json's bos_token when it names a token, else the
 * special token the post-processor's template puts before the text (Llama's
 * <s>, <|begin_of_text|>), else -1. EOS: tokenizer_config.json's eos_token
 * when it names a token, else -1 (the caller decides: look up </s>,
 * <|endoftext|>, <|eot_id|> ... with tokenizer_token_to_id, or read
 * generation_config.json's eos_token_id). */
int32_t tokenizer_bos_id(const struct tokenizer *tok);
int32_t tokenizer_eos_id(const struct tokenizer *tok);

/*
 * Streaming decode, for printing text while ids are generated.
 *
 * Decoding is not additive: decode(a + b) is not decode(a) + decode(b). A
 * byte-level or byte-fallback token can end inside a UTF-8 character (decoded
 * alone it is U+FFFD), Llama 2's decoder strips one space at the start of the
 * whole text, Metaspace drops the first token's marker. The stream decodes a
 * short window of ids twice (without and with the new ids, as Hugging Face's
 * text-generation-inference does) and hands out the difference once the window
 * no longer ends in U+FFFD (or more than 8 ids are held back: no character
 * takes that many, the text is not UTF-8): the pieces concatenated equal
 * decode(all ids) for text that decodes without U+FFFD, and each piece is
 * whole UTF-8 characters. Cost per id: decoding a few ids; the window drops
 * ids as their text is out.
 *
 *     struct tokenizer_stream st;
 *     tokenizer_stream_init(&st, tok, prompt_ids, n_prompt, 1);
 *     for each new id: text = tokenizer_stream_push(&st, id, &len); fwrite(text, 1, len, stdout);
 *     at the end:      text = tokenizer_stream_finish(&st, &len); fwrite(...);
 *     tokenizer_stream_free(&st);
 *
 * With context (the prompt's ids, not printed) the first pieces read as the
 * continuation of the prompt's text (Llama 2's leading space kept); without,
 * as decode() of the generated ids alone.
 */
struct tokenizer_stream {
    const struct tokenizer *tok;
    int32_t *ids;       /* the window: ids[0, read) decoded and printed, ids[read, n) pending */
    size_t n, cap;
    size_t read;
    int skip_special;
    char *out;          /* the last piece handed out (owned by the stream) */
    size_t out_cap;
};

/* context: up to the last STREAM_CONTEXT ids of it are kept as the window's
 * start (may be NULL with n_context 0). */
void tokenizer_stream_init(struct tokenizer_stream *st, const struct tokenizer *tok, const int32_t *context,
                           size_t n_context, int skip_special);
/* Adds id; returns the text that became final (*len bytes, NUL-terminated,
 * possibly empty), valid until the next call on st. */
const char *tokenizer_stream_push(struct tokenizer_stream *st, int32_t id, size_t *len);
/* The text still pending (an incomplete character comes out as U+FFFD). */
const char *tokenizer_stream_finish(struct tokenizer_stream *st, size_t *len);
void tokenizer_stream_free(struct tokenizer_stream *st);

#endif
