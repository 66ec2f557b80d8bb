/*
 * hf_json — the one reader of Hugging Face JSON files (config.json,
 * tokenizer.json, tokenizer_config.json, generation_config.json,
 * special_tokens_map.json, adapter_config.json, safetensors headers and
 * indexes), tolerant of what transformers, tokenizers and PEFT write through
 * Python's json module and jansson refuses:
 *
 *  - integers beyond 64 bits: transformers writes "model_max_length":
 *    1000000000000000019884624838656 (int(1e30), its "no limit") when a
 *    tokenizer has none. Such a literal is read as a real (1e30), which is
 *    what the value means: a limit that is never reached. A consumer that
 *    needs an integer sees a real and says so.
 *  - NaN, Infinity, -Infinity (Python's json writes float('nan') and the
 *    infinities bare): read as the strings "NaN", "Infinity", "-Infinity",
 *    since a jansson real cannot hold them; hf_json_number reads them back
 *    as numbers.
 *
 * Both are rewritten in the text before jansson (still the parser) sees it,
 * outside string literals only, without adding or removing a line: a parse
 * error's line is the file's line. Unknown keys are the consumers' business:
 * each reads the keys it knows and ignores the others.
 *
 * tokenizer_config.json's chat_template is a string or (transformers >= 4.39)
 * a list of {"name", "template"}: hf_chat_template picks one by name.
 */
#ifndef SHARDLM_HF_JSON_H
#define SHARDLM_HF_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* json_load_file / json_loadb / json_loadfd with the rewrites above; flags
 * and err as jansson's (err->line is the file's line; a file that cannot be
 * opened or read fails as jansson's json_load_file does, with the reason in
 * err->text). A new reference, or NULL. */
json_t *hf_json_load_file(const char *path, size_t flags, json_error_t *err);
json_t *hf_json_loadb(const char *text, size_t len, size_t flags, json_error_t *err);
json_t *hf_json_loadfd(int fd, size_t flags, json_error_t *err);

/* Why a load failed, into buf (cap bytes), returned: "not valid JSON (TEXT at
 * line L, column C)" where jansson knows the place, else its TEXT alone (a
 * file it could not open or read, which jansson marks with line -1). */
const char *hf_json_why(const json_error_t *err, char *buf, size_t cap);

/* v as a number: an integer, a real, or one of the strings "NaN",
 * "Infinity", "-Infinity" that the loader makes of Python's bare literals.
 * false (out untouched) for anything else. */
bool hf_json_number(const json_t *v, double *out);

/* tokenizer_config.json's chat template called name (NULL: "default"): the
 * string itself when chat_template is a string (it is the default), else the
 * "template" of the list entry whose "name" is name. NULL when there is
 * none. The string belongs to config. */
const char *hf_chat_template(const json_t *config, const char *name);

/* The names of the templates in a list-form chat_template, in file order,
 * into names[0, cap); returns how many there are (0 for a string or none). */
size_t hf_chat_template_names(const json_t *config, const char **names, size_t cap);

#endif
