#!/usr/bin/env python3
"""t_docs — documentation that cannot rot: README.md and docs/ against the code.

Checks (each a few seconds at most; nothing is trained):
  config.reference     `shardlm config --reference` (printed from the schema table
                       of src/config/config_schema.c) is docs/configuration.md,
                       byte for byte (regenerate: bin/shardlm config --reference >
                       docs/configuration.md)
  config.documented.*  every documented key, set alone in a config, is not refused
                       as unknown; every documented DeepSpeed key shardlm ignores
                       gets its documented warning; every documented refused key
                       stops with its documented error (exit 2)
  config.read_keys     every key path src/config/*.c reads is documented (a key the
                       reader takes that the reference does not name)
  config.defaults      each literal default in the reference is the value the
                       reader writes into the resolved config of a minimal one
  links.*              every relative link of README.md, CHANGELOG.md and docs/
                       names a file that exists, and its #anchor a heading there
  commands.*           every `shardlm ...` line of a code block (fenced or
                       indented) parses: a known command, its options as its
                       --help lists them, its positional count; a repository
                       config in it passes `shardlm config --no-files` with the
                       line's --deepspeed and --set; every repository path on a
                       code line (input/, jobs/, tools/, tests/, docs/) exists
  figures.*            every figure of the README's headline table is in the
                       docs/benchmarks.md section its row links, and that section
                       gives the command that measures it
  pages.*              README.md is at most 300 lines; each user page starts with
                       what it is for and ends with the errors a user may meet;
                       no user page names an issue number
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ROOT, check, run_main, scratch_dir  # noqa: E402

TMP = scratch_dir("t_docs")
README_MAX_LINES = 300  # issue's limit for the README
USER_PAGES = ["getting-started", "models", "data", "methods", "memory", "checkpoints", "gpus", "benchmarks",
              "troubleshooting", "metrics", "contributing"]
REPO_PATH = re.compile(r"(?<![\w/.-])((?:input|jobs|tools|tests|docs)/[\w./-]*[\w])")
# positional arguments each command takes (min, max); None: any number
POSITIONALS = {"train": (1, 1), "config": (0, 1), "plan": (0, 1), "eval": (1, 1), "generate": (1, 1),
               "export": (2, 2), "inspect": (1, 1), "tokenize": (1, None)}


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw)


def md_files():
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return files


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces as -."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def prose_and_code(text):
    """(prose lines, code lines) with their 1-based numbers; code: fenced or indented 4 spaces."""
    prose, code, fence = [], [], False
    prev_blank = True
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if fence or (line.startswith("    ") and (prev_blank or code and code[-1][0] == n - 1)
                     and not line.lstrip().startswith(("* ", "- ", "|"))):
            code.append((n, line))
        else:
            prose.append((n, line))
        prev_blank = not line.strip()
    return prose, code


def anchors_of(path):
    seen, out = {}, set()
    fence = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        m = re.match(r"^(#{1,6}) (.+?)\s*$", line)
        if m and not fence:
            s = slug(m.group(2))
            k = seen.get(s, 0)
            out.add(s if k == 0 else f"{s}-{k}")
            seen[s] = k + 1
    return out


# ---- configuration ---------------------------------------------------------------------------------------


def reference_tables(text):
    """{table header: [cells per row]} of the reference's tables."""
    tables, current = {}, None
    for line in text.split("\n"):
        if line.startswith("| key |"):
            current = tables.setdefault(line, [])
        elif current is not None and line.startswith("|") and not line.startswith("|---"):
            current.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif not line.startswith("|"):
            current = None
    return tables


def sample_value(type_cell):
    kind = type_cell.split(" or ")[0]
    return {"integer": 1, "number": 1.5, "boolean": False, "string": "x", "object": {}, "array": [],
            "any": None}[kind]


def doc_with(path, value):
    doc, parts = {}, path.split(".")
    node = doc
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return doc


def config_run(name, doc, extra=()):
    cfg = os.path.join(TMP, name + ".json")
    with open(cfg, "w") as f:
        json.dump(doc, f)
    return run([BIN, "config", cfg, "--no-files", *extra])


def check_configuration():
    ref = run([BIN, "config", "--reference"])
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as f:
        page = f.read()
    check("config.reference", ref.returncode == 0 and ref.stdout == page,
          f"exit {ref.returncode} {ref.stderr.strip()[:200]}; docs/configuration.md differs from "
          "`bin/shardlm config --reference`: regenerate it")
    tables = reference_tables(page)
    keys = [r for h, rows in tables.items() if h.startswith("| key | type | default") for r in rows]
    ignored = [r for h, rows in tables.items() if h.startswith("| key | type | warning") for r in rows]
    refused = [r for h, rows in tables.items() if h.startswith("| key | error") for r in rows]
    check("config.tables", len(keys) > 100 and len(ignored) > 20 and len(refused) > 3,
          f"{len(keys)} keys, {len(ignored)} ignored, {len(refused)} refused in docs/configuration.md")
    unknown, wrong_warning, wrong_error = [], [], []
    for row in keys:
        path = row[0].strip("`")
        r = config_run("key", doc_with(path, sample_value(row[1])))
        if "unknown key" in r.stderr:
            unknown.append(path)
    for row in ignored:
        path = row[0].strip("`")
        r = config_run("ignored", doc_with(path, sample_value(row[1])))
        warning = row[2].strip("`")
        if warning not in r.stderr:
            wrong_warning.append(f"{path}: {r.stderr.strip()[:120]}")
    for row in refused:
        path = row[0].strip("`")
        r = config_run("refused", doc_with(path, 1))
        if r.returncode != 2 or row[1].strip("`") != r.stderr.strip():
            wrong_error.append(f"{path}: exit {r.returncode} {r.stderr.strip()[:120]}")
    check("config.documented.accepted", not unknown, f"documented but refused as unknown: {unknown[:5]}")
    check("config.documented.ignored", not wrong_warning, f"{len(wrong_warning)}: {wrong_warning[:3]}")
    check("config.documented.refused", not wrong_error, f"{len(wrong_error)}: {wrong_error[:3]}")

    documented = {r[0].strip("`") for r in keys + ignored + refused}
    read = set()
    for src in glob.glob(os.path.join(ROOT, "src", "config", "*.c")):
        text = open(src, encoding="utf-8").read()
        read |= set(re.findall(r'read_(?:int64|int|num|bool|str|path)\(root, "([a-z0-9_.]+)"', text))
    missing = sorted(read - documented)
    check("config.read_keys", len(read) > 60 and not missing, f"{len(read)} keys read; undocumented: {missing[:8]}")

    # literal defaults against the resolved config of a minimal one
    r = config_run("minimal", {"train_batch_size": 1})
    resolved = json.loads(r.stdout) if r.returncode == 0 else {}
    compared, differ = 0, []
    for row in keys:
        path, default = row[0].strip("`"), row[2].strip("`")
        try:
            want = json.loads(default)
        except ValueError:
            continue  # words ("4 × n_embd (the preset's)"): not a literal
        node = resolved
        for p in path.split("."):
            node = node.get(p) if isinstance(node, dict) else None
        if node is None or isinstance(want, (dict, list)) and not want:
            continue
        compared += 1
        if node != want and not (isinstance(want, (int, float)) and isinstance(node, (int, float))
                                 and abs(node - want) <= 1e-12 * max(abs(want), 1)):
            differ.append(f"{path}: documented {default}, resolved {node}")
    check("config.defaults", r.returncode == 0 and compared >= 30 and not differ,
          f"exit {r.returncode} {r.stderr[:200]}; {compared} compared; {differ[:5]}")


# ---- links ----------------------------------------------------------------------------------------------


def check_links():
    broken, count = [], 0
    for md in md_files():
        text = open(md, encoding="utf-8").read()
        prose, _ = prose_and_code(text)
        for n, line in prose:
            for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                count += 1
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
                where = f"{os.path.relpath(md, ROOT)}:{n}: {target}"
                if not os.path.exists(dest):
                    broken.append(where + " (no such file)")
                elif anchor and (not dest.endswith(".md") or anchor not in anchors_of(dest)):
                    broken.append(where + " (no such heading)")
    check("links.resolve", count > 50 and not broken, f"{count} links; {len(broken)} broken: {broken[:6]}")


# ---- commands -------------------------------------------------------------------------------------------


def options_of(cmd, cache={}):
    """{--option: takes an argument} from `shardlm CMD --help`."""
    if cmd not in cache:
        text = run([BIN, cmd, "--help"]).stdout
        opts = {}
        for m in re.finditer(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)( [A-Z][\w.=|<>-]*| [a-z]+\|[\w|]+)?", text, re.M):
            opts.setdefault(m.group(1), bool(m.group(2)))  # the first line naming it is its own
        cache[cmd] = opts
    return cache[cmd]


def code_commands(md):
    """(line number, text) of each command line in md's code blocks, continuation lines joined."""
    _, code = prose_and_code(open(md, encoding="utf-8").read())
    out, pending = [], None
    for n, line in code:
        text = line.strip()
        if pending:
            text = pending[1] + " " + text
            n = pending[0]
        if text.endswith("\\"):
            pending = (n, text[:-1].rstrip())
            continue
        pending = None
        out.append((n, text))
    return out


def parse_shardlm(line):
    """Problems of one shardlm command line; [] when it parses. Runs `shardlm config` on a repository config."""
    line = re.sub(r"^\$ ", "", line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        return [f"not shell words: {e}"]
    for stop in (">", "|", "2>", ">>", "&&", ";"):
        if stop in words:
            words = words[:words.index(stop)]
    i = next((k for k, w in enumerate(words) if re.search(r"(^|/)shardlm(-cuda)?$", w)), None)
    if i is None or i + 1 >= len(words):
        return []
    cmd, args = words[i + 1], words[i + 2:]
    if cmd not in POSITIONALS:
        return [f"unknown command {cmd!r}"]
    if any(a.startswith("[") for a in args) or "..." in args:
        args = [a for a in args if not a.startswith("[") and a != "..."]  # a synopsis or an elided line
        elided = True
    else:
        elided = False
    opts, problems, positional, sets, deepspeed = options_of(cmd), [], [], [], None
    k = 0
    while k < len(args):
        a = args[k]
        name, eq, value = a.partition("=")
        if a.startswith("--"):
            if name not in opts:
                problems.append(f"{cmd}: unknown option {name}")
            elif opts[name] and not eq:
                k += 1
                if k >= len(args):
                    if not elided:
                        problems.append(f"{cmd}: {name} needs a value")
                    break
                value = args[k]
            if name == "--set":
                sets.append(value)
            if name == "--deepspeed":
                deepspeed = value
        elif a != "-" and a.startswith("-") and len(a) > 1:
            if a not in ("-h",):
                problems.append(f"{cmd}: unknown option {a}")
        else:
            positional.append(a)
        k += 1
    lo, hi = POSITIONALS[cmd]
    if not elided and (len(positional) < lo or hi is not None and len(positional) > hi):
        problems.append(f"{cmd}: {len(positional)} arguments ({positional}), takes {lo} to {hi}")
    config = positional[0] if cmd in ("train", "plan", "config") and positional else None
    if config and os.path.isfile(os.path.join(ROOT, config)) and "--reference" not in args:
        extra = ["--deepspeed", deepspeed] if deepspeed else []
        for s in sets:
            extra += ["--set", s]
        r = run([BIN, "config", config, "--no-files", *extra])
        if r.returncode != 0:
            problems.append(f"{config}: {r.stderr.strip()[:160]}")
    return problems


def check_commands():
    problems, count, paths = [], 0, []
    for md in md_files():
        rel = os.path.relpath(md, ROOT)
        if rel.startswith("docs/gpu/") or rel == "CHANGELOG.md":
            continue  # records: the commands of their day
        for n, line in code_commands(md):
            program = re.sub(r"^\$ ", "", line).split(" ", 1)[0]
            is_command = re.match(r"(bin/|tools/|tests/|jobs/|(/usr/bin/)?python3$|bash$|sbatch$|srun$|mpirun$|make$)",
                                  program)
            for p in REPO_PATH.findall(line) if is_command else ():
                if not os.path.exists(os.path.join(ROOT, p)) and not p.startswith(("tests/gpu/session",)):
                    paths.append(f"{rel}:{n}: {p}")
            if re.search(r"(^|[\s/])shardlm(-cuda)? [a-z]", line):
                count += 1
                for p in parse_shardlm(line):
                    problems.append(f"{rel}:{n}: {p}")
    check("commands.parse", count >= 20 and not problems, f"{count} command lines; {problems[:6]}")
    check("commands.paths", not paths, f"repository paths that do not exist: {paths[:6]}")


# ---- figures and pages ----------------------------------------------------------------------------------


def check_figures():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    bench_path = os.path.join(ROOT, "docs", "benchmarks.md")
    bench = open(bench_path, encoding="utf-8").read()
    sections = {slug(h): body for h, body in re.findall(r"(?m)^#{2,3} (.+)\n((?:(?!^#{2,3} ).*\n?)*)", bench)}
    rows = re.findall(r"^\| \*\*([^*]+)\*\* \|.*\]\(docs/benchmarks\.md#([\w-]+)\) \|$", readme, re.M)
    bad = []
    for figure, anchor in rows:
        body = sections.get(anchor)
        if body is None:
            bad.append(f"{figure}: no section #{anchor}")
        elif figure not in body:
            bad.append(f"{figure}: not in #{anchor}")
        elif not re.search(r"`[^`]*(tools/bench/|shardlm )[^`]*`|^    .*tools/bench/", body, re.M):
            bad.append(f"{figure}: #{anchor} gives no command")
    # every bold figure (a number with x/× or %) in the README is one of the table's
    quoted = set(re.findall(r"\*\*([\d.]+ ?(?:×|x|%))\*\*", readme))
    untabled = quoted - {f for f, _ in rows}
    check("figures.benchmarks", len(rows) >= 5 and not bad and not untabled,
          f"{len(rows)} rows; {bad[:4]}; figures outside the table: {sorted(untabled)[:4]}")


def check_pages():
    n = len(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split("\n")) - 1
    check("pages.readme_length", n <= README_MAX_LINES, f"README.md has {n} lines, more than {README_MAX_LINES}")
    bad, issues = [], []
    for name in USER_PAGES:
        path = os.path.join(ROOT, "docs", name + ".md")
        if not os.path.exists(path):
            bad.append(f"{name}.md missing")
            continue
        text = open(path, encoding="utf-8").read()
        paragraphs = [p for p in text.split("\n\n") if p.strip()]
        if len(paragraphs) < 2 or not paragraphs[1].startswith("What this page is for"):
            bad.append(f"{name}.md does not start with what it is for")
        heads = re.findall(r"(?m)^## (.+)$", text)
        if not heads or heads[-1] != "Errors you may meet":
            bad.append(f"{name}.md does not end with 'Errors you may meet'")
    for path in [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md")):
        if os.path.basename(path) == "DESIGN.md":
            continue  # the contributors' design notes
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            if re.search(r"\bissues? \d+", line, re.I):
                issues.append(f"{os.path.relpath(path, ROOT)}:{n}")
    check("pages.shape", not bad, "; ".join(bad[:6]))
    check("pages.no_issue_numbers", not issues, f"issue numbers on user pages: {issues[:6]}")


def main():
    check_configuration()
    check_links()
    check_commands()
    check_figures()
    check_pages()


if __name__ == "__main__":
    run_main("docs", main)
