/*
 * tokenizer_bpe — BPE merging of one pre-token, as tokenizers' BPE model does
 * it (models/bpe/model.rs merge_word, word.rs merge_all), so that every id
 * and every tie comes out the same.
 *
 * The word starts as one symbol per character: its vocabulary id; else, with
 * byte_fallback, one <0xXX> symbol per byte when all its bytes have one; else
 * the unk token (consecutive ones fused into one with fuse_unk); else the
 * character is dropped. Then, from a min-heap of candidate merges keyed by
 * (rank, position) over a doubly linked list of the symbols, the lowest rank
 * is merged first, the leftmost among equal ranks. A candidate goes stale when
 * a neighbour merges; it is dropped when popped (lazy invalidation) unless
 * the pair now at its position merges into the same id, the test tokenizers
 * makes. O(n log n) in the characters of the word: Llama 2's tokenizer has no
 * pre-tokenizer and merges a whole text as one word.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

struct tok_bpe_symbol {
    int32_t id;
    int32_t prev, next;  /* neighbours in the list, -1: none */
    uint32_t len;        /* bytes of the word it covers; 0: merged into its left neighbour */
};

struct tok_bpe_candidate {
    uint32_t rank;
    uint32_t pos;        /* the left symbol of the pair */
    int32_t merged;
};

static bool candidate_before(const struct tok_bpe_candidate *a, const struct tok_bpe_candidate *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tok_bpe_work *w, uint32_t rank, uint32_t pos, int32_t merged)
{
    tok_grow((void **)&w->heap, &w->cap_heap, w->n_heap + 1, sizeof *w->heap);
    struct tok_bpe_candidate c = {.rank = rank, .pos = pos, .merged = merged};
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!candidate_before(&c, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
}

static struct tok_bpe_candidate heap_pop(struct tok_bpe_work *w)
{
    struct tok_bpe_candidate top = w->heap[0];
    struct tok_bpe_candidate last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n && candidate_before(&w->heap[child + 1], &w->heap[child]))
            child++;
        if (!candidate_before(&w->heap[child], &last))
            break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

static void add_symbol(struct tok_bpe_work *w, int32_t id, size_t len)
{
    tok_grow((void **)&w->symbols, &w->cap_symbols, w->n_symbols + 1, sizeof *w->symbols);
    int32_t at = (int32_t)w->n_symbols;
    if (at > 0)
        w->symbols[at - 1].next = at;
    w->symbols[w->n_symbols++] = (struct tok_bpe_symbol){.id = id, .prev = at - 1, .next = -1, .len = (uint32_t)len};
}

/* Pushes the merge of the symbols at left and right, if the pair has one. */
static void push_pair(struct tok_bpe_work *w, const struct tok_merge_map *merges, int32_t left, int32_t right)
{
    const struct tok_merge *m = tok_merge_map_get(merges, w->symbols[left].id, w->symbols[right].id);
    if (m)
        heap_push(w, m->rank, (uint32_t)left, m->merged);
}

static void merge_all(struct tok_bpe_work *w, const struct tok_merge_map *merges)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < w->n_symbols; i++)
        push_pair(w, merges, (int32_t)i, (int32_t)i + 1);
    while (w->n_heap > 0) {
        struct tok_bpe_candidate top = heap_pop(w);
        struct tok_bpe_symbol *s = &w->symbols[top.pos];
        if (s->len == 0 || s->next < 0)
            continue;
        struct tok_bpe_symbol *right = &w->symbols[s->next];
        const struct tok_merge *m = tok_merge_map_get(merges, s->id, right->id);
        if (!m || m->merged != top.merged)
            continue; /* stale: the pair at pos is no longer the one pushed */
        s->id = top.merged;
        s->len += right->len;
        s->next = right->next;
        right->len = 0;
        if (s->next >= 0)
            w->symbols[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0)
            push_pair(w, merges, s->prev, (int32_t)top.pos);
        if (s->next >= 0)
            push_pair(w, merges, (int32_t)top.pos, s->next);
    }
}

/* The vocabulary id of the one-character token c (clen bytes), -1 if none. */
static int32_t char_id(const struct tokenizer *tok, const char *c, size_t clen)
{
    if (clen <= 2) {
        uint32_t cp = tok_utf8_decode(c);
        return tok->bpe.char_ids[cp];
    }
    return tok_str_map_get(&tok->bpe.vocab, &tok->strings, c, clen);
}

/* Each byte of c as its <0xXX> token, if all have one. */
static bool add_byte_fallback(const struct tok_bpe *bpe, struct tok_bpe_work *w, const char *c, size_t clen)
{
    for (size_t k = 0; k < clen; k++)
        if (bpe->byte_ids[(unsigned char)c[k]] < 0)
            return false;
    for (size_t k = 0; k < clen; k++)
        add_symbol(w, bpe->byte_ids[(unsigned char)c[k]], 1);
    return true;
}

int tok_bpe_tokenize(const struct tokenizer *tok, const char *word, size_t len, struct tok_bpe_work *w,
                     struct tok_ids *out, char *err, size_t errlen)
{
    const struct tok_bpe *bpe = &tok->bpe;
    if (len == 0)
        return 0;
    if (bpe->ignore_merges) {
        int32_t id = tok_str_map_get(&bpe->vocab, &tok->strings, word, len);
        if (id >= 0) {
            tok_ids_push(out, id);
            return 0;
        }
    }
    w->n_symbols = 0;
    bool unk_pending = false;
    size_t unk_len = 0;
    for (size_t i = 0; i < len;) {
        size_t clen = tok_utf8_len((unsigned char)word[i]);
        int32_t id = char_id(tok, word + i, clen);
        if (id >= 0) {
            if (unk_pending)
                add_symbol(w, bpe->unk_id, unk_len);
            unk_pending = false;
            add_symbol(w, id, clen);
        } else if (bpe->byte_fallback && add_byte_fallback(bpe, w, word + i, clen)) {
            /* as tokenizers: a pending unk stays pending across byte tokens */
        } else if (bpe->unk_token) {
            if (bpe->unk_missing) {
                tok_err(err, errlen, "%s: the text has a character (U+%04X) that is not in the vocabulary, and "
                        "the unk_token '%s' is not in the vocabulary either; fix the model's unk_token",
                        tok->path, tok_utf8_decode(word + i), bpe->unk_token);
                return -1;
            }
            if (unk_pending && bpe->fuse_unk) {
                unk_len += clen;
            } else {
                if (unk_pending)
                    add_symbol(w, bpe->unk_id, unk_len);
                unk_pending = true;
                unk_len = clen;
            }
        }
        i += clen;
    }
    if (unk_pending)
        add_symbol(w, bpe->unk_id, unk_len);
    merge_all(w, &bpe->merges);
    for (size_t i = 0; i < w->n_symbols; i++)
        if (w->symbols[i].len)
            tok_ids_push(out, w->symbols[i].id);
    return 0;
}

void tok_bpe_work_free(struct tok_bpe_work *w)
{
    free(w->symbols);
    free(w->heap);
    memset(w, 0, sizeof *w);
}
