/*
 * test_hf_json — the tolerant reader of Hugging Face JSON files (src/core/hf_json.h):
 *   transformers' "no limit" model_max_length (int(1e30), 31 digits) read as
 *   the real 1e30, and negative and boundary integers (INT64_MAX stays an
 *   integer, INT64_MAX + 1 becomes a real); Python's bare NaN, Infinity and
 *   -Infinity read back as numbers by hf_json_number, nothing inside strings
 *   rewritten (escaped quotes included); a parse error names the file's line
 *   after a rewrite on an earlier line; a missing file fails with the reason;
 *   chat_template as a string (the default) and as a list of named templates.
 */
#include "check.h"
#include "core/hf_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char doc[] =
    "{\"model_max_length\": 1000000000000000019884624838656,\n"
    " \"neg\": -1000000000000000019884624838656, \"max\": 9223372036854775807, \"over\": 9223372036854775808,\n"
    " \"min\": -9223372036854775808, \"under\": -9223372036854775809, \"real\": 1.5e300, \"small\": -12,\n"
    " \"nan\": NaN, \"inf\": Infinity, \"ninf\": -Infinity, \"list\": [NaN,1e5,-Infinity],\n"
    " \"text\": \"NaN \\\" Infinity 1000000000000000019884624838656 \\\\\", \"after\": -Infinity,\n"
    " \"unknown_key\": {\"nested\": [1, 2, {\"x\": null}]}}\n";

static void check_values(json_t *root)
{
    json_t *v = json_object_get(root, "model_max_length");
    CHECK("huge_integer_is_real", json_is_real(v) && json_real_value(v) == 1e30, "got %s %.17g",
          json_is_real(v) ? "real" : "not a real", json_number_value(v));
    v = json_object_get(root, "neg");
    CHECK("huge_negative_is_real", json_is_real(v) && json_real_value(v) == -1e30, "got %.17g", json_number_value(v));
    v = json_object_get(root, "max");
    CHECK("int64_max_stays_integer", json_is_integer(v) && json_integer_value(v) == INT64_MAX, "got %lld",
          (long long)json_integer_value(v));
    v = json_object_get(root, "min");
    CHECK("int64_min_stays_integer", json_is_integer(v) && json_integer_value(v) == INT64_MIN, "got %lld",
          (long long)json_integer_value(v));
    v = json_object_get(root, "over");
    CHECK("int64_max_plus_one_is_real", json_is_real(v) && json_real_value(v) == 9223372036854775808.0, "got %.17g",
          json_number_value(v));
    v = json_object_get(root, "under");
    CHECK("int64_min_minus_one_is_real", json_is_real(v) && json_real_value(v) == -9223372036854775809.0, "got %.17g",
          json_number_value(v));
    v = json_object_get(root, "small");
    CHECK("small_integer_untouched", json_is_integer(v) && json_integer_value(v) == -12, "not -12");
    double x = 0;
    CHECK("nan", hf_json_number(json_object_get(root, "nan"), &x) && isnan(x), "got %g", x);
    CHECK("infinity", hf_json_number(json_object_get(root, "inf"), &x) && isinf(x) && x > 0, "got %g", x);
    CHECK("minus_infinity", hf_json_number(json_object_get(root, "ninf"), &x) && isinf(x) && x < 0, "got %g", x);
    CHECK("minus_infinity_after_string", hf_json_number(json_object_get(root, "after"), &x) && isinf(x) && x < 0,
          "got %g", x);
    json_t *list = json_object_get(root, "list");
    double a = 0, b = 0, c = 0;
    CHECK("in_array", json_array_size(list) == 3 && hf_json_number(json_array_get(list, 0), &a) && isnan(a) &&
          hf_json_number(json_array_get(list, 1), &b) && b == 1e5 && hf_json_number(json_array_get(list, 2), &c) &&
          isinf(c) && c < 0, "got %g %g %g", a, b, c);
    CHECK("real_number", hf_json_number(json_object_get(root, "real"), &x) && x == 1.5e300, "got %g", x);
    CHECK("not_a_number", !hf_json_number(json_object_get(root, "text"), &x) &&
          !hf_json_number(json_object_get(root, "unknown_key"), &x), "a string or an object read as a number");
    const char *text = json_string_value(json_object_get(root, "text"));
    CHECK("strings_untouched", text && strcmp(text, "NaN \" Infinity 1000000000000000019884624838656 \\") == 0,
          "got '%s'", text ? text : "(none)");
}

int main(void)
{
    json_error_t err;
    json_t *root = hf_json_loadb(doc, strlen(doc), JSON_REJECT_DUPLICATES, &err);
    CHECK("parses", json_is_object(root), "%s at line %d", err.text, err.line);
    if (root)
        check_values(root);
    json_decref(root);

    /* plain jansson refuses what the loader reads */
    json_t *plain = json_loads(doc, 0, &err);
    CHECK("jansson_alone_refuses", plain == NULL, "jansson read the document: the test proves nothing");
    json_decref(plain);

    char dir[] = "/tmp/test_hf_json.XXXXXX", path[64];
    CHECK("tmpdir", mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model_max_length\": 1000000000000000019884624838656,\n\"x\": NaN,\n\"y\": [1, 2,,]\n}\n", f);
    fclose(f);
    root = hf_json_load_file(path, 0, &err);
    CHECK("error_names_the_line", !root && err.line == 3 && strstr(err.source, "tokenizer_config.json"),
          "line %d source '%s' text '%s'", err.line, err.source, err.text);
    json_decref(root);

    f = fopen(path, "w");
    fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", "
          "\"template\": \"D\"}, {\"name\": \"rag\", \"template\": \"R\"}]}", f);
    fclose(f);
    root = hf_json_load_file(path, 0, &err);
    const char *names[4] = {0};
    size_t n = hf_chat_template_names(root, names, 4);
    CHECK("chat_template_list_default", hf_chat_template(root, NULL) && strcmp(hf_chat_template(root, NULL), "D") == 0,
          "got %s", hf_chat_template(root, NULL) ? hf_chat_template(root, NULL) : "(none)");
    CHECK("chat_template_list_by_name", hf_chat_template(root, "rag") && !strcmp(hf_chat_template(root, "rag"), "R") &&
          !hf_chat_template(root, "nope"), "rag or nope wrong");
    CHECK("chat_template_names", n == 3 && !strcmp(names[0], "tool_use") && !strcmp(names[2], "rag"), "%zu names", n);
    json_decref(root);
    root = json_loads("{\"chat_template\": \"S\"}", 0, &err);
    CHECK("chat_template_string", hf_chat_template(root, NULL) && !strcmp(hf_chat_template(root, NULL), "S") &&
          !hf_chat_template(root, "rag") && hf_chat_template_names(root, names, 4) == 0, "string form wrong");
    json_decref(root);

    unlink(path);
    root = hf_json_load_file(path, 0, &err);
    CHECK("missing_file", !root && strstr(err.text, "unable to open") && strstr(err.text, "No such file"),
          "got '%s'", err.text);
    rmdir(dir);
    return check_status();
}
