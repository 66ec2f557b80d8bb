/*
 * generate — `shardlm generate` (run/infer.h opens the model).
 *
 * generate: prompts are tokenized (the model's tokenizer.json, special
 * tokens added as tokenizers' encode does), dealt out B per rank per round
 * (prompt i of a round of B N to rank i / B), prefilled in one forward per
 * rank (rows right-padded; a row's padding writes cache positions that its
 * next tokens overwrite before they are read), then decoded one token per
 * row per forward through the key/value cache. Every rank runs the same
 * number of forwards: the round goes on while any rank has a row still
 * generating (an all-reduce per token), rows that are done or empty just
 * ride along, so no rank waits in a gather for one that stopped. A prompt's
 * tokens depend only on the model, the prompt, the options and its index
 * (the sampling generator is seeded per prompt), not on the world size or
 * the batch. Rank 0 gathers the rounds' tokens and prints the results in
 * prompt order.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "cli_args.h"
#include "generate.h"
#include "core/hf_json.h"
#include "run/infer.h"
#include "run/sample.h"
#include "tokenizer/tokenizer.h"
#include "core/util.h"

#define MAX_STOPS 16

/* ---- prompts ---------------------------------------------------------------------------- */

enum finish { FINISH_NONE = 0, FINISH_EOS, FINISH_STOP, FINISH_LENGTH };
static const char *const finish_names[] = {"", "eos", "stop", "length"};

struct prompt {
    char *text;       /* NULL: given as ids */
    json_t *messages; /* {"messages": [...]} of --prompt-file: a conversation for the chat template */
    struct tokenizer_stream *stream; /* the --prompt streamed to stdout as its tokens come (rank 0) */
    int32_t *ids;
    int n;            /* prompt tokens (after truncation) */
    int truncated;    /* tokens cut from its start (--truncate-prompt) */
    int32_t *out;     /* generated tokens */
    int n_out;
    int finish;
    uint64_t rng;
};

struct gen_options {
    const char *prompt, *prompt_file;
    int chat;         /* --chat 1, --no-chat 0, else -1: when the tokenizer has a chat template */
    int max_new, batch;
    bool truncate, json, add_special, ignore_eos;
    const char *stops[MAX_STOPS];
    int n_stops;
    struct sampling sp;
};

static char *read_text_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_input("cannot read --prompt-file '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap)
            buf = xrealloc(buf, cap *= 2);
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* A prompt given as token ids ({"ids": [...]}), checked against the vocabulary. */
static void prompt_ids(struct prompt *p, json_t *ids, const char *file, int line_no)
{
    p->n = (int)json_array_size(ids);
    p->ids = xcalloc((size_t)p->n + 1, sizeof *p->ids);
    for (int i = 0; i < p->n; i++) {
        json_t *v = json_array_get(ids, (size_t)i);
        if (!json_is_integer(v))
            fail_input("--prompt-file '%s' line %d: \"ids\"[%d] is not an integer; give token ids (integers from 0)",
                       file, line_no, i);
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            fail_input("--prompt-file '%s' line %d: \"ids\"[%d] is %lld, not a token id (an integer from 0 to %d); "
                       "give the ids of the model's tokenizer", file, line_no, i, (long long)json_integer_value(v),
                       INT32_MAX);
        p->ids[i] = (int32_t)json_integer_value(v);
    }
}

/* --prompt, or --prompt-file: one JSON value per line, a string, an object
 * with a "prompt" string, or one with "ids" (token ids, not tokenized);
 * blank lines skipped. */
static struct prompt *read_prompts(const struct gen_options *g, int *n_out)
{
    struct prompt *p = NULL;
    int n = 0;
    if (g->prompt) {
        p = xcalloc(1, sizeof *p);
        p[0].text = xstrdup(g->prompt);
        *n_out = 1;
        return p;
    }
    size_t len;
    char *all = read_text_file(g->prompt_file, &len);
    int line_no = 0;
    for (char *line = all, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_no++;
        if (strspn(line, " \t\r") == strlen(line))
            continue;
        json_error_t err;
        json_t *v = json_loads(line, JSON_DECODE_ANY, &err);
        json_t *s = json_is_object(v) ? json_object_get(v, "prompt") : v;
        json_t *ids = json_is_object(v) ? json_object_get(v, "ids") : NULL;
        json_t *messages = json_is_object(v) ? json_object_get(v, "messages") : NULL;
        if (!json_is_string(s) && !json_is_array(ids) && !json_is_array(messages))
            fail_input("--prompt-file '%s' line %d: %s; each line must be a JSON string or an object with a "
                       "\"prompt\" string, a \"messages\" list or an \"ids\" array",
                       g->prompt_file, line_no, v ? "no \"prompt\" string" : err.text);
        p = xrealloc(p, (size_t)(n + 1) * sizeof *p);
        memset(&p[n], 0, sizeof *p);
        if (json_is_string(s))
            p[n].text = xstrdup(json_string_value(s));
        else if (json_is_array(messages))
            p[n].messages = json_incref(messages);
        else
            prompt_ids(&p[n], ids, g->prompt_file, line_no);
        n++;
        json_decref(v);
    }
    free(all);
    if (!n)
        fail_input("--prompt-file '%s' holds no prompt", g->prompt_file);
    *n_out = n;
    return p;
}

/* ---- the chat template ---------------------------------------------------------------- */

/* What the tokenizer's directory holds of a chat template, by the rules of transformers 5.25's
 * AutoTokenizer (tokenization_utils_base._from_pretrained and get_chat_template), which
 * tools/prepare_data.py's find_chat_template (what renders it) follows too:
 *   chat_template.jinja is the "default" template, additional_chat_templates/NAME.jinja a named one;
 *   when either exists they replace tokenizer_config.json's chat_template (a string, the default, or
 *   transformers 4's list of {"name", "template"}); the "default" one is rendered, and without it
 *   transformers refuses. chat_template.json is a processor's file, which AutoTokenizer does not read.
 * why (cap bytes) says, when there is no default, what there is, as the first clause of an error. */
enum chat_template_kind { CHAT_TEMPLATE_NONE, CHAT_TEMPLATE_NO_DEFAULT, CHAT_TEMPLATE_DEFAULT };

static bool regular_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static enum chat_template_kind chat_template_kind(const char *tokenizer_json, char *why, size_t cap)
{
    char dir[4096], path[4200];
    const char *slash = strrchr(tokenizer_json, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - tokenizer_json) : 1, slash ? tokenizer_json : ".");
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (regular_file(path))
        return CHAT_TEMPLATE_DEFAULT;
    /* the named templates' names, for the error when none is "default" */
    char names[512] = ""; /* cut short past 512 bytes: only an error shows them */
    size_t used = 0;
    snprintf(path, sizeof path, "%s/additional_chat_templates", dir);
    DIR *named = opendir(path);
    for (struct dirent *e; named && (e = readdir(named));) {
        const size_t len = strlen(e->d_name);
        if (len <= 6 || strcmp(e->d_name + len - 6, ".jinja") != 0)
            continue;
        if (strcmp(e->d_name, "default.jinja") == 0) {
            closedir(named);
            return CHAT_TEMPLATE_DEFAULT;
        }
        if (used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%.*s", used ? ", " : "", (int)len - 6,
                                     e->d_name);
    }
    if (named)
        closedir(named);
    if (!used) { /* no template file: tokenizer_config.json's, as transformers 4 wrote it */
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        if (regular_file(path)) {
            json_error_t err;
            char load_why[300];
            json_t *config = hf_json_load_file(path, 0, &err);
            if (!config)
                fail_input("%s: cannot read it: %s; fix the file, or give --no-chat", path,
                           hf_json_why(&err, load_why, sizeof load_why));
            const bool has_default = hf_chat_template(config, NULL) != NULL;
            const char *list[16];
            const size_t n = hf_chat_template_names(config, list, 16);
            for (size_t i = 0; i < n && i < 16; i++)
                if (used < sizeof names)
                    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", list[i]);
            json_decref(config);
            if (has_default)
                return CHAT_TEMPLATE_DEFAULT;
        }
    }
    if (used) {
        snprintf(why, cap, "%s's chat templates (%s) have no \"default\" one", dir, names);
        return CHAT_TEMPLATE_NO_DEFAULT;
    }
    snprintf(path, sizeof path, "%s/chat_template.json", dir);
    snprintf(why, cap,
             "%s has no chat template (chat_template.jinja, additional_chat_templates/default.jinja or "
             "tokenizer_config.json's chat_template)%s",
             dir, regular_file(path) ? "; its chat_template.json is a processor's, which transformers' tokenizer "
                                       "does not read" : "");
    return CHAT_TEMPLATE_NONE;
}

/* tools/chat_template.py of the checkout this binary was built in: bin/'s
 * parent, or build-asan/bin/'s grandparent (SHARDLM_TOOLS: another tools
 * directory). */
static void chat_tool(char *out, size_t cap)
{
    const char *dir = getenv("SHARDLM_TOOLS");
    if (dir && *dir) {
        snprintf(out, cap, "%s/chat_template.py", dir);
        return;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    for (int up = 1; up <= 3; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash)
            break;
        *slash = '\0';
        snprintf(out, cap, "%s/tools/chat_template.py", exe);
        if (access(out, R_OK) == 0)
            return;
    }
    snprintf(out, cap, "tools/chat_template.py (beside the shardlm binary)");
}

/* Renders every text or messages prompt through the chat template
 * (tools/chat_template.py: transformers' apply_chat_template with
 * add_generation_prompt), one run for all of them. */
static void apply_chat_template(struct prompt *p, int n, const char *tokenizer_json)
{
    char tool[4200], in_path[] = "/tmp/shardlm-chat.XXXXXX";
    chat_tool(tool, sizeof tool);
    if (access(tool, R_OK) != 0)
        fail_input("--chat needs %s (shardlm's tools directory; set SHARDLM_TOOLS to it), or give --no-chat", tool);
    int fd = mkstemp(in_path);
    if (fd < 0)
        fail_input("--chat: cannot make a temporary file in /tmp: %s", strerror(errno));
    FILE *in = fdopen(fd, "w");
    for (int i = 0; i < n; i++) {
        if (!p[i].text && !p[i].messages)
            continue;
        json_t *m = p[i].messages ? json_incref(p[i].messages)
                                  : json_pack("[{s:s,s:s}]", "role", "user", "content", p[i].text);
        char *line = json_dumps(m, JSON_COMPACT);
        fprintf(in, "%s\n", line);
        free(line);
        json_decref(m);
    }
    if (fclose(in) != 0)
        fail_input("--chat: cannot write the temporary file %s: %s", in_path, strerror(errno));
    int pipefd[2];
    if (pipe(pipefd) != 0)
        fail_input("--chat: pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        int infd = open(in_path, O_RDONLY);
        dup2(infd, 0);
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        execl(tool, tool, "--tokenizer", tokenizer_json, (char *)NULL);
        fprintf(stderr, "shardlm: error: --chat: cannot run %s: %s\n", tool, strerror(errno));
        _exit(EXIT_BAD_INPUT);
    }
    close(pipefd[1]);
    FILE *out = fdopen(pipefd[0], "r");
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < n; i++) {
        if (!p[i].text && !p[i].messages)
            continue;
        json_error_t err;
        json_t *v = getline(&line, &cap, out) > 0 ? json_loads(line, JSON_DECODE_ANY, &err) : NULL;
        if (!json_is_string(v))
            break; /* the tool said why on stderr; its exit status ends this below */
        free(p[i].text);
        p[i].text = xstrdup(json_string_value(v));
        json_decref(v);
        if (p[i].messages) {
            json_decref(p[i].messages);
            p[i].messages = NULL;
        }
    }
    free(line);
    fclose(out);
    int status = 0;
    waitpid(pid, &status, 0);
    unlink(in_path);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_input("--chat: %s could not render the prompts with the chat template of '%s' (its message above)",
                   tool, tokenizer_json);
    for (int i = 0; i < n; i++)
        if (p[i].messages)
            fail_input("--chat: %s gave fewer prompts than it was given", tool);
}

/* Token ids of text: the tokenizer's, or its bytes for a byte-level model. */
static void encode(const struct infer *s, const char *text, bool add_special, int32_t **ids, int *n)
{
    const size_t len = strlen(text);
    if (!s->tok) {
        *ids = xcalloc(len + 1, sizeof **ids);
        for (size_t i = 0; i < len; i++)
            (*ids)[i] = (unsigned char)text[i];
        *n = (int)len;
        return;
    }
    char err[512];
    size_t count = 0;
    if (tokenizer_encode(s->tok, text, len, add_special, ids, &count, err, sizeof err) != 0)
        fail_input("tokenizer '%s': %s", s->tokenizer_path, err);
    *n = (int)count;
}

/* The text of ids (NUL-terminated; *len bytes, which may hold NUL); NULL
 * without a tokenizer (but for a byte-level model). */
static char *decode(const struct infer *s, const int32_t *ids, int n, size_t *len)
{
    *len = 0;
    if (!s->tok && s->cfg.model.vocab_size > 256)
        return NULL;
    if (!s->tok) {
        char *t = xcalloc((size_t)n + 1, 1);
        for (int i = 0; i < n; i++)
            t[i] = (char)ids[i];
        *len = (size_t)n;
        return t;
    }
    return tokenizer_decode(s->tok, ids, (size_t)n, 1, len);
}

/* Where the first stop string starts in text, or NULL. */
static char *find_stop(const struct gen_options *g, char *text)
{
    char *first = NULL;
    for (int i = 0; i < g->n_stops; i++) {
        char *at = strstr(text, g->stops[i]);
        if (at && (!first || at < first))
            first = at;
    }
    return first;
}

static bool is_eos(const struct infer *s, int32_t id)
{
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id)
            return true;
    return false;
}

/* ---- the generation loop ---------------------------------------------------------------- */

struct round_row {
    struct prompt *p; /* NULL: an empty row */
    int32_t last;     /* the token fed next */
};

/* Row b's new token: chosen, appended, and whether the prompt is done. */
static void take_token(struct infer *s, const struct gen_options *g, struct prompt *p, const float *logits,
                       void *work, int ctx)
{
    const int32_t id = sample_choose(logits, s->cfg.model.vocab_size, &g->sp, &p->rng, work);
    p->out[p->n_out++] = id;
    if (p->stream && (g->ignore_eos || !is_eos(s, id))) {
        size_t len;
        const char *piece = tokenizer_stream_push(p->stream, id, &len);
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
    }
    if (!g->ignore_eos && is_eos(s, id)) {
        p->finish = FINISH_EOS;
        return;
    }
    if (g->n_stops) { /* --stop needs text: infer_require_tokenizer checked */
        size_t len;
        char *text = decode(s, p->out, p->n_out, &len);
        bool stop = find_stop(g, text) != NULL;
        free(text);
        if (stop) {
            p->finish = FINISH_STOP;
            return;
        }
    }
    if (p->n_out == g->max_new || p->n + p->n_out >= ctx)
        p->finish = FINISH_LENGTH;
}

/* Whether row b goes past a longrope model's original_max_position_embeddings with its next token (at position
 * kv->past[b]): its cache holds keys of the short factors, and transformers' generate runs the whole sequence
 * again from there with the long ones. */
static bool crossing(const struct round_row *r, const struct family_kv *kv, int b, int rope_switch)
{
    return rope_switch && r->p && !r->p->finish && kv->past[b] == rope_switch;
}

/* That run for the crossing rows of this rank (every rank runs it when one has such a row): each runs its prompt
 * and tokens so far from an empty cache (llama_prepare picks the long factors by its length), which gives its next
 * token; the other rows are silent (kv->last -1), their caches untouched. */
static void recompute(struct infer *s, const struct gen_options *g, struct round_row *rows, int B, int ctx,
                      int rope_switch, float *logits, void *work)
{
    struct family_acts *a = &s->sess.acts;
    struct family_kv *kv = &s->sess.kv;
    int32_t *past = xcalloc((size_t)B, sizeof *past);
    bool *redo = xcalloc((size_t)B, sizeof *redo);
    int T = 1;
    for (int b = 0; b < B; b++) {
        redo[b] = crossing(&rows[b], kv, b, rope_switch);
        T = redo[b] ? rope_switch + 1 : T;
    }
    for (int b = 0; b < B; b++) {
        const struct prompt *p = rows[b].p;
        for (int t = 0; t < T; t++) {
            a->inputs[b * T + t] = !redo[b] ? 0 : t < p->n ? p->ids[t] : p->out[t - p->n];
            a->positions[b * T + t] = t;
        }
        past[b] = kv->past[b];
        kv->past[b] = 0;
        kv->last[b] = redo[b] ? T - 1 : -1;
    }
    session_forward(&s->sess, B, T, 0);
    for (int b = 0; b < B; b++) {
        kv->past[b] = redo[b] ? T : past[b];
        if (!redo[b])
            continue;
        family_read_logits(a, b, logits);
        take_token(s, g, rows[b].p, logits, work, ctx);
    }
    free(past);
    free(redo);
}

/* One round: rows of this rank (B at most, prompts or empty). */
static void run_round(struct infer *s, const struct gen_options *g, struct round_row *rows, int B, int ctx,
                      float *logits, void *work, double *t_prefill, double *t_decode)
{
    struct family_acts *a = &s->sess.acts;
    struct family_kv *kv = &s->sess.kv;
    int T = 1;
    for (int b = 0; b < B; b++)
        if (rows[b].p && rows[b].p->n > T)
            T = rows[b].p->n;
    for (int b = 0; b < B; b++) {
        const struct prompt *p = rows[b].p;
        for (int t = 0; t < T; t++) {
            a->inputs[b * T + t] = p && t < p->n ? p->ids[t] : 0;
            a->positions[b * T + t] = t;
        }
        kv->past[b] = 0;
        kv->last[b] = p ? p->n - 1 : 0;
    }
    double t0 = now_seconds();
    session_forward(&s->sess, B, T, 0);
    int active = 0;
    for (int b = 0; b < B; b++) {
        struct prompt *p = rows[b].p;
        if (!p)
            continue;
        family_read_logits(a, b, logits);
        take_token(s, g, p, logits, work, ctx);
        kv->past[b] = p->n;
        active += !p->finish;
    }
    *t_prefill += now_seconds() - t0;
    t0 = now_seconds();
    const int rope_switch = model_rope_switch(&s->sess.model.cfg, kv->Tmax);
    bool *redo = xcalloc((size_t)B, sizeof *redo);
    for (;;) {
        int now[2] = {active, 0}; /* any row generating; any crossing (every rank then runs the recompute) */
        for (int b = 0; b < B; b++) {
            redo[b] = crossing(&rows[b], kv, b, rope_switch);
            now[1] |= redo[b];
        }
        comm_allreduce(s->sess.comm, now, 2, COMM_I32, COMM_MAX, NULL);
        if (!now[0])
            break;
        for (int b = 0; b < B; b++) {
            struct prompt *p = rows[b].p;
            const bool on = p && !p->finish && !redo[b]; /* a crossing row's token comes from the recompute */
            a->inputs[b] = on ? p->out[p->n_out - 1] : 0;
            if (!on) /* done or empty: rewrites a position of its own, never read */
                kv->past[b] = kv->past[b] ? kv->past[b] - 1 : 0;
            a->positions[b] = kv->past[b];
            kv->last[b] = 0;
        }
        session_forward(&s->sess, B, 1, 0);
        for (int b = 0; b < B; b++) {
            struct prompt *p = rows[b].p;
            kv->past[b]++;
            if (!p || p->finish || redo[b])
                continue;
            family_read_logits(a, b, logits);
            take_token(s, g, p, logits, work, ctx);
        }
        if (now[1])
            recompute(s, g, rows, B, ctx, rope_switch, logits, work);
        active = 0;
        for (int b = 0; b < B; b++)
            active += rows[b].p && !rows[b].p->finish;
    }
    free(redo);
    *t_decode += now_seconds() - t0;
}

/* Rank 0 collects every rank's rows of a round: per row its token count, its
 * finish and max_new tokens. */
static void gather_round(struct infer *s, const struct gen_options *g, struct prompt *prompts, int n_prompts,
                         int first, int B)
{
    const size_t per = (size_t)2 + (size_t)g->max_new;
    int32_t *mine = xcalloc((size_t)B * per, sizeof *mine);
    int32_t *all = xcalloc((size_t)B * per * s->sess.world, sizeof *all);
    for (int b = 0; b < B; b++) {
        const int i = first + s->sess.rank * B + b;
        if (i >= n_prompts)
            continue;
        mine[b * per] = prompts[i].n_out;
        mine[b * per + 1] = prompts[i].finish;
        memcpy(mine + b * per + 2, prompts[i].out, (size_t)prompts[i].n_out * sizeof *mine);
    }
    comm_allgather(s->sess.comm, mine, all, (size_t)B * per, COMM_I32, NULL);
    for (int k = 0; k < B * s->sess.world; k++) {
        const int i = first + k;
        if (i >= n_prompts)
            break;
        prompts[i].n_out = all[k * per];
        prompts[i].finish = all[k * per + 1];
        memcpy(prompts[i].out, all + k * per + 2, (size_t)prompts[i].n_out * sizeof *mine);
    }
    free(mine);
    free(all);
}

static void print_result(const struct infer *s, const struct gen_options *g, const struct prompt *p, int index)
{
    size_t len;
    char *text = decode(s, p->out, p->n_out, &len);
    char *stop = p->finish == FINISH_STOP ? find_stop(g, text) : NULL;
    if (stop)
        len = (size_t)(stop - text);
    if (!g->json && !g->prompt_file) { /* a --prompt: text, so a tokenizer */
        if (p->stream) { /* its text went out as it came */
            const char *rest = tokenizer_stream_finish(p->stream, &len);
            fwrite(rest, 1, len, stdout);
        } else
            fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
    } else {
        json_t *ids = json_array();
        for (int i = 0; i < p->n_out; i++)
            json_array_append_new(ids, json_integer(p->out[i]));
        json_t *o = json_pack("{si s:s? s:o s:o si si s:s}", "index", index, "prompt", p->text, "completion",
                              text ? json_stringn(text, len) : json_null(),
                              "ids", ids, "prompt_tokens", p->n, "truncated", p->truncated, "finish_reason",
                              finish_names[p->finish]);
        char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(line);
        free(line);
        json_decref(o);
    }
    free(text);
}

static void usage_generate(FILE *out)
{
    fprintf(out,
            "usage: shardlm generate MODEL (--prompt TEXT | --prompt-file FILE) [options]\n"
            "\n"
            "Continues prompts with the model: MODEL is a Hugging Face directory, a checkpoint or a run's\n"
            "checkpoint.dir (a LoRA checkpoint with its base). Under mpirun the ranks share the model (ZeRO) and\n"
            "the prompts.\n"
            "\n"
            "options:\n"
            "  --prompt TEXT          one prompt; its completion is printed as it is made\n"
            "  --prompt-file FILE     one JSON string, {\"prompt\": TEXT}, {\"messages\": [...]} or {\"ids\": [token\n"
            "                         ids]} per line; one\n"
            "                         JSON line per result\n"
            "  --max-new-tokens N     tokens to generate at most (default 128)\n"
            "  --temperature T        0: greedy (default); else sampling at this temperature\n"
            "  --top-k K              sample among the K most likely (default 0: all)\n"
            "  --top-p P              sample among the most likely reaching probability P (default 1)\n"
            "  --seed S               the sampling seed (default 0); a prompt's draws depend on it and its index\n"
            "  --stop TEXT            stop a completion where TEXT appears (repeatable, at most %d)\n"
            "  --batch B              prompts per rank per forward (default 8)\n"
            "  --truncate-prompt      cut prompts longer than the context from their start (default: error)\n"
            "  --no-special           no special tokens added to the prompts (default: the tokenizer adds them)\n"
            "  --ignore-eos           go on past the end-of-sequence token (benchmarks)\n"
            "  --chat                 render each text prompt as a user turn with the tokenizer's chat template\n"
            "                         (transformers' apply_chat_template, add_generation_prompt), and\n"
            "                         {\"messages\": [...]} lines as conversations; the default when the\n"
            "                         tokenizer has one (chat_template.jinja, or tokenizer_config.json's\n"
            "                         chat_template; tools/chat_template.py renders); without one, an error\n"
            "  --no-chat              prompts as given, without the chat template\n"
            "  --json                 the --prompt result as a JSON line too (ids, finish reason)\n"
            "  --base DIR             a LoRA checkpoint's base (default: the directory its run started from)\n"
            "  --tokenizer FILE       a tokenizer.json (default: MODEL's or its base's)\n"
            "  --set KEY.PATH=VALUE   override a config key, e.g. --set zero_optimization.stage=3\n"
            "  -h, --help             this text\n",
            MAX_STOPS);
}

int cmd_generate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"prompt", required_argument, NULL, 'p'},      {"prompt-file", required_argument, NULL, 'f'},
        {"max-new-tokens", required_argument, NULL, 'n'}, {"temperature", required_argument, NULL, 't'},
        {"top-k", required_argument, NULL, 'k'},       {"top-p", required_argument, NULL, 'P'},
        {"seed", required_argument, NULL, 'S'},        {"stop", required_argument, NULL, 'x'},
        {"batch", required_argument, NULL, 'b'},       {"truncate-prompt", no_argument, NULL, 'T'},
        {"no-special", no_argument, NULL, 'N'},        {"json", no_argument, NULL, 'j'},
        {"ignore-eos", no_argument, NULL, 'E'},       {"chat", no_argument, NULL, 'c'},
        {"no-chat", no_argument, NULL, 'C'},
        {"base", required_argument, NULL, 'B'},        {"tokenizer", required_argument, NULL, 'z'},
        {"set", required_argument, NULL, 's'},         {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct gen_options g = {.max_new = 128, .batch = 8, .chat = -1, .add_special = true, .sp = {0.0f, 0, 1.0f, 0}};
    struct infer_options o = {0};
    const char *sets[CLI_MAX_SETS];
    int n_sets = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': g.prompt = optarg; break;
        case 'f': g.prompt_file = optarg; break;
        case 'n': g.max_new = (int)cli_parse_int(optarg, "--max-new-tokens", 1, 1 << 20); break;
        case 't': g.sp.temperature = cli_parse_float(optarg, "--temperature"); break;
        case 'k': g.sp.top_k = (int)cli_parse_int(optarg, "--top-k", 0, 1 << 30); break;
        case 'P': g.sp.top_p = cli_parse_float(optarg, "--top-p"); break;
        case 'S': g.sp.seed = (uint64_t)cli_parse_int(optarg, "--seed", 0, (1L << 62)); break;
        case 'x':
            if (g.n_stops == MAX_STOPS)
                fail_input("too many --stop strings (at most %d)", MAX_STOPS);
            if (!*optarg)
                fail_input("--stop needs a non-empty string");
            g.stops[g.n_stops++] = optarg;
            break;
        case 'b': g.batch = (int)cli_parse_int(optarg, "--batch", 1, 4096); break;
        case 'T': g.truncate = true; break;
        case 'N': g.add_special = false; break;
        case 'j': g.json = true; break;
        case 'E': g.ignore_eos = true; break;
        case 'c': g.chat = 1; break;
        case 'C': g.chat = 0; break;
        case 'h': usage_generate(stdout); return EXIT_OK;
        default:
            if (cli_model_option(c, &o, sets, &n_sets))
                break;
            usage_generate(stderr);
            return EXIT_BAD_INPUT;
        }
    }
    if (optind != argc - 1)
        fail_input("generate needs exactly one MODEL; see 'shardlm generate --help'");
    if (!g.prompt == !g.prompt_file)
        fail_input("generate needs --prompt TEXT or --prompt-file FILE (one of them); see 'shardlm generate --help'");
    if (g.sp.temperature < 0.0f)
        fail_input("--temperature %g is negative; 0 means greedy", g.sp.temperature);
    if (!(g.sp.top_p > 0.0f && g.sp.top_p <= 1.0f))
        fail_input("--top-p %g is outside (0, 1]", g.sp.top_p);
    o.model = argv[optind];
    o.sets = sets;
    o.n_sets = n_sets;
    log_info_to_stderr();

    struct comm comm;
    comm_init(&comm, NULL, NULL);
    int n_prompts = 0;
    struct prompt *prompts = read_prompts(&g, &n_prompts);
    struct infer s;
    infer_open(&s, &comm, &o);
    infer_require_eos(&s);
    const int ctx = s.cfg.model.n_positions;
    if (g.n_stops)
        infer_require_tokenizer(&s, o.model, "--stop compares text");
    bool any_text = false, any_messages = false;
    for (int i = 0; i < n_prompts; i++) {
        any_text |= prompts[i].text != NULL;
        any_messages |= prompts[i].messages != NULL;
    }
    if (any_messages && !g.chat)
        fail_input("--prompt-file '%s' holds {\"messages\"} conversations, which need the chat template: drop "
                   "--no-chat", g.prompt_file);
    if (any_text || any_messages)
        infer_require_tokenizer(&s, o.model, "a prompt is text");
    /* --chat, or conversations, need the template: never the raw text in its place (issue 44). Without
     * either, text prompts take it when the directory has one, and go as given when it has none. */
    char why[4800]; /* a directory path and the names of its templates */
    const enum chat_template_kind template =
        any_text || any_messages ? chat_template_kind(s.tokenizer_path, why, sizeof why) : CHAT_TEMPLATE_NONE;
    if (any_messages && template != CHAT_TEMPLATE_DEFAULT)
        fail_input("--prompt-file '%s' holds {\"messages\"} conversations, which need a chat template, and %s; "
                   "add one (chat_template.jinja), or give text prompts", g.prompt_file, why);
    if (g.chat == 1 && any_text && template != CHAT_TEMPLATE_DEFAULT)
        fail_input("--chat: %s; add one (chat_template.jinja), or drop --chat", why);
    if (g.chat == -1 && any_text && template == CHAT_TEMPLATE_NO_DEFAULT)
        fail_input("%s, so the prompts cannot be rendered with it; add a chat_template.jinja, or give --no-chat",
                   why);
    const bool chat = (any_text || any_messages) && g.chat != 0 && template == CHAT_TEMPLATE_DEFAULT;
    if (chat) {
        apply_chat_template(prompts, n_prompts, s.tokenizer_path);
        if (s.sess.rank == 0)
            log_info("generate: prompts rendered with the chat template of %s (--no-chat: as given)",
                     s.tokenizer_path);
    }
    int longest = 1, reach = 2;
    for (int i = 0; i < n_prompts; i++) {
        struct prompt *p = &prompts[i];
        if (p->text) /* a rendered chat carries its special tokens as text, as apply_chat_template's */
            encode(&s, p->text, chat ? false : g.add_special, &p->ids, &p->n);
        for (int k = 0; k < p->n; k++)
            if (p->ids[k] >= s.cfg.model.vocab_size)
                fail_input("prompt %d: token id %d at position %d is outside the model's vocabulary of %d (ids 0 to "
                           "%d); give the ids of the model's tokenizer", i + 1, p->ids[k], k, s.cfg.model.vocab_size,
                           s.cfg.model.vocab_size - 1);
        if (p->n == 0)
            fail_input("prompt %d is empty: give it some text", i + 1);
        if (p->n >= ctx) {
            if (!g.truncate)
                fail_input("prompt %d has %d tokens and the model's context is %d: shorten it, or pass "
                           "--truncate-prompt to keep its last tokens",
                           i + 1, p->n, ctx);
            const int keep = ctx - g.max_new > ctx / 2 ? ctx - g.max_new : ctx / 2;
            p->truncated = p->n - keep;
            memmove(p->ids, p->ids + p->truncated, (size_t)keep * sizeof *p->ids);
            p->n = keep;
        }
        p->out = xcalloc((size_t)g.max_new, sizeof *p->out);
        uint64_t st = g.sp.seed * 0x9E3779B97F4A7C15ull + (uint64_t)i;
        p->rng = splitmix64(&st);
        longest = p->n > longest ? p->n : longest;
        reach = p->n + g.max_new > reach ? p->n + g.max_new : reach;
    }
    const int B = g.batch < n_prompts ? g.batch : n_prompts, Tmax = reach < ctx ? reach : ctx;
    /* longrope: a sequence that crosses original_max_position_embeddings runs again from its start (recompute) */
    const int rope_switch = model_rope_switch(&s.cfg.model, Tmax);
    infer_start(&s, &o, B, rope_switch >= longest ? rope_switch + 1 : longest, Tmax);
    struct tokenizer_stream stream;
    if (g.prompt && !g.json && !g.n_stops && s.tok && s.sess.rank == 0) { /* --prompt's text as it comes */
        tokenizer_stream_init(&stream, s.tok, prompts[0].ids, prompts[0].n, 1);
        prompts[0].stream = &stream;
    }
    if (s.sess.rank == 0)
        log_info("generate: %d prompt%s (%d tokens at most) on %d rank%s, %d rows per rank, cache of %d positions",
                 n_prompts, n_prompts > 1 ? "s" : "", longest, s.sess.world, s.sess.world > 1 ? "s" : "", B, Tmax);
    const int V = s.cfg.model.vocab_size;
    float *logits = xcalloc((size_t)s.cfg.model.padded_vocab, sizeof *logits);
    void *work = xmalloc(SAMPLE_WORK_BYTES(V));
    struct round_row *rows = xcalloc((size_t)B, sizeof *rows);
    double t_prefill = 0.0, t_decode = 0.0, t0 = now_seconds();
    for (int first = 0; first < n_prompts; first += B * s.sess.world) {
        for (int b = 0; b < B; b++) {
            const int i = first + s.sess.rank * B + b;
            rows[b].p = i < n_prompts ? &prompts[i] : NULL;
        }
        run_round(&s, &g, rows, B, ctx, logits, work, &t_prefill, &t_decode);
        gather_round(&s, &g, prompts, n_prompts, first, B);
    }
    const double elapsed = now_seconds() - t0;
    long new_tokens = 0;
    for (int i = 0; i < n_prompts; i++)
        new_tokens += prompts[i].n_out;
    if (s.sess.rank == 0) {
        for (int i = 0; i < n_prompts; i++)
            print_result(&s, &g, &prompts[i], i);
        fflush(stdout);
        log_info("generate: %ld new tokens in %.2f s (%.1f tokens/s; prefill %.2f s, decode %.2f s)", new_tokens,
                 elapsed, (double)new_tokens / elapsed, t_prefill, t_decode);
    }
    free(logits);
    free(work);
    free(rows);
    if (prompts[0].stream)
        tokenizer_stream_free(prompts[0].stream);
    for (int i = 0; i < n_prompts; i++) {
        json_decref(prompts[i].messages);
        free(prompts[i].text);
        free(prompts[i].ids);
        free(prompts[i].out);
    }
    free(prompts);
    infer_close(&s);
    comm_finalize(&comm);
    return EXIT_OK;
}
