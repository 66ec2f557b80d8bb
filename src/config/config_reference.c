/*
 * config_reference — the configuration reference (config.h,
 * config_print_reference): docs/configuration.md as `shardlm config
 * --reference` prints it, from the schema table of config_schema.c. A row
 * the reader accepts with an effect and has no one-line meaning is refused
 * here, so a key cannot be accepted and undocumented.
 */
#include "config_internal.h"

#include "core/util.h"
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

static const char *type_name(const struct key_spec *s)
{
    static const char *const names[] = {
        [K_INT] = "integer", [K_NUM] = "number", [K_BOOL] = "boolean", [K_STR] = "string",
        [K_OBJ] = "object",  [K_ARRAY] = "array", [K_ANY] = "any",
    };
    static char with_null[32];
    if (!(s->flags & F_NULLABLE))
        return names[s->kind];
    snprintf(with_null, sizeof with_null, "%s or null", names[s->kind]);
    return with_null;
}

/* "@presets" and "@types" name the architecture table's lists (model/arch.h). */
static void print_allowed(FILE *out, const char *allowed)
{
    if (!allowed)
        return;
    const char *list = strcmp(allowed, "@presets") == 0 ? arch_preset_names()
                       : strcmp(allowed, "@types") == 0 ? arch_type_names()
                                                        : NULL;
    if (!list) {
        fputs(allowed, out);
        return;
    }
    /* the list is "a, b, c": each name in backquotes */
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ", ");
        fprintf(out, "`%.*s`", (int)n, p);
        p += n;
        if (*p) {
            fputs(", ", out);
            p += strspn(p, ", ");
        }
    }
}

enum row_group { GROUP_EFFECT, GROUP_NO_EFFECT, GROUP_REFUSED };

static enum row_group group_of(const struct key_spec *s)
{
    if (s->flags & F_REJECT)
        return GROUP_REFUSED;
    if (s->flags & F_NO_EFFECT)
        return GROUP_NO_EFFECT;
    return GROUP_EFFECT;
}

/* Prints the rows of `group` under `prefix`, depth first in table order. */
static void print_rows(FILE *out, const struct key_spec *specs, const char *prefix, enum row_group group)
{
    for (const struct key_spec *s = specs; s->name; s++) {
        char path[KEY_PATH_CAP];
        join_path(path, sizeof path, prefix, s->name);
        if (group_of(s) == group) {
            switch (group) {
            case GROUP_EFFECT:
                if (!s->doc || !*s->doc)
                    fail_internal("config schema: '%s' is accepted but has no meaning (doc); add one in "
                                  "src/config/config_schema.c",
                                  path);
                fprintf(out, "| `%s` | %s | %s | ", path, type_name(s), s->def ? s->def : "");
                print_allowed(out, s->allowed);
                fprintf(out, " | %s |\n", s->doc);
                break;
            case GROUP_NO_EFFECT:
                fprintf(out, "| `%s` | %s | `shardlm: warning: %s is accepted but has no effect in shardlm%s` |\n", path,
                        type_name(s), path, s->hint ? s->hint : "");
                break;
            case GROUP_REFUSED:
                fprintf(out, "| `%s` | `shardlm: error: config: '%s' %s` |\n", path, path, s->hint);
                break;
            }
        }
        if (s->kind == K_OBJ && s->children && !(s->flags & (F_NO_EFFECT | F_REJECT)))
            print_rows(out, s->children, path, group);
    }
}

static const char reference_head[] =
    "# Configuration reference\n"
    "\n"
    "<!-- Generated: `shardlm config --reference` prints this page from the schema table in\n"
    "src/config/config_schema.c. Edit the table, then `bin/shardlm config --reference > docs/configuration.md`;\n"
    "tests/t_docs.py fails when the two differ. -->\n"
    "\n"
    "Every key a shardlm config file accepts, with its type, default, allowed values and meaning; then the\n"
    "DeepSpeed keys shardlm accepts without effect (each gets one warning) and those it refuses.\n"
    "\n"
    "A config is one JSON file in DeepSpeed's vocabulary plus shardlm's own sections (`model`, `data`,\n"
    "`train`, `checkpoint`, `lora`, `dpo`). DeepSpeed's keys mean what DeepSpeed says. `--deepspeed FILE`\n"
    "merges a DeepSpeed file given beside the config (a key set to different values in both is an error);\n"
    "`--set a.b=c` overrides any key (the value is parsed as JSON when it is JSON, else taken as a string;\n"
    "`null` removes a value). `shardlm config CONFIG` reads and checks a config as `shardlm train` would and\n"
    "prints the resolved document, running nothing.\n"
    "\n"
    "Learning-rate schedules follow DeepSpeed's `lr_schedules.py`, including its step convention: optimizer\n"
    "step *s* runs at the rate of `last_batch_iteration = s − 1` (so WarmupLR's first step uses\n"
    "`warmup_min_lr`, and WarmupCosineLR's first step uses 0).\n"
    "\n"
    "## Keys\n"
    "\n";

static const char reference_tail[] =
    "\n"
    "## Errors you may meet\n"
    "\n"
    "Every one is one line on stderr naming the key path, and exit status 2; nothing has been allocated.\n"
    "\n"
    "* `config: unknown key 'a.b' (did you mean 'a.c'?)`: a misspelt key, or one of another tool. Use the\n"
    "  name the message suggests, or one of the keys above.\n"
    "* `config: 'a.b' must be an integer, got a string`: the value's JSON type is wrong; see the type column.\n"
    "* `config: 'a.b' is \"auto\"`: \"auto\" is filled in by the Hugging Face Trainer, which shardlm does not\n"
    "  use; give a value.\n"
    "* `config: 'a.b' ... must be ...`, `known: ...`: a value outside the allowed column.\n"
    "* `config: train_batch_size (...) must equal ...`: the three batch keys disagree for this world size;\n"
    "  give two of them and let shardlm derive the third.\n"
    "* `config: 'model.x' is ... but DIR/config.json gives ...`: with `model.from_pretrained`, the model\n"
    "  directory decides the shape; remove the key.\n"
    "* A DeepSpeed key of the refused table: the message says what to write instead.\n"
    "* A warning `... is accepted but has no effect in shardlm`: the key is harmless and can stay, or be\n"
    "  removed to silence the warning.\n";

void config_print_reference(FILE *out)
{
    fputs(reference_head, out);
    fputs("| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n", out);
    print_rows(out, top_keys, "", GROUP_EFFECT);
    fputs("\n## DeepSpeed keys shardlm ignores\n\n"
          "Accepted, with this warning once each; they change nothing.\n\n"
          "| key | type | warning |\n|---|---|---|\n",
          out);
    print_rows(out, top_keys, "", GROUP_NO_EFFECT);
    fputs("\n## DeepSpeed keys shardlm refuses\n\n"
          "DeepSpeed's deprecated or misplaced spellings: the run stops at once with this error (exit status 2).\n\n"
          "| key | error |\n|---|---|\n",
          out);
    print_rows(out, top_keys, "", GROUP_REFUSED);
    fputs(reference_tail, out);
}
