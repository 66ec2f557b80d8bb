#!/usr/bin/env python3
"""t_layers — src/'s layers, drawn from the code's own #include lines.

src/ holds one folder per layer (src/README.md). A file may include headers of
its own layer and of the layers below it, never of a layer above: that rules
out import circles between folders too, since the order is total. Inside one
folder, files may include each other freely (a folder's private files). The
checks, each failing on the first offender it finds:

  layers.known       every folder under src/ is a layer named in LAYERS
  layers.no_loose    no source file directly in src/ (outside a layer folder)
  layers.resolved    every quoted #include names a header that exists, spelled
                     from src/ ("core/util.h") or from the including file's folder
  layers.no_upward   no include from a lower layer to a higher one
  layers.size        no source file over 1,000 lines
  layers.design_refs every "DESIGN §N" in src/ names a section docs/DESIGN.md has
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

# lowest first; a layer may include itself and what comes before it
LAYERS = ["core", "comm", "backend", "tokenizer", "data", "model", "io", "zero", "families", "engine",
          "config", "run", "cli"]
MAX_LINES = 1000
SOURCE = (".c", ".h", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)

failed = 0


def check(name, bad, why=""):
    global failed
    if bad:
        failed += 1
        print(f"FAIL {name}: {why}")
    else:
        print(f"ok {name}")


def sources():
    for d, _, files in os.walk(SRC):
        for f in sorted(files):
            if f.endswith(SOURCE):
                yield os.path.relpath(os.path.join(d, f), SRC)


def layer_of(rel):
    return rel.split(os.sep)[0]


files = sorted(sources())
folders = sorted({layer_of(f) for f in files if os.sep in f})
unknown = [f for f in folders if f not in LAYERS]
check("layers.known", unknown, f"folders not in the layer list: {unknown} (add them to LAYERS here and to docs/DESIGN.md §1)")
loose = [f for f in files if os.sep not in f]
check("layers.no_loose", loose, f"source files outside a layer folder: {loose}")

unresolved, upward, edges = [], [], set()
for f in files:
    text = open(os.path.join(SRC, f), encoding="utf-8").read()
    for inc in INCLUDE.findall(text):
        here = os.path.normpath(os.path.join(os.path.dirname(f), inc))
        if os.path.isfile(os.path.join(SRC, here)):
            target = here
        elif os.path.isfile(os.path.join(SRC, inc)):
            target = os.path.normpath(inc)
        else:
            unresolved.append(f"{f}: {inc}")
            continue
        a, b = layer_of(f), layer_of(target)
        if a in LAYERS and b in LAYERS and LAYERS.index(b) > LAYERS.index(a):
            upward.append(f"{f} -> {target} ({a} below {b})")
        edges.add((a, b))
check("layers.resolved", unresolved, "; ".join(unresolved[:5]))
check("layers.no_upward", upward, f"{len(upward)} upward include(s): " + "; ".join(upward[:8]))

big = []
for f in files:
    with open(os.path.join(SRC, f), encoding="utf-8") as fh:
        n = sum(1 for _ in fh)
    if n > MAX_LINES:
        big.append(f"{f} ({n})")
check("layers.size", big, f"over {MAX_LINES} lines: {', '.join(big)}")

design = os.path.join(ROOT, "docs", "DESIGN.md")
sections = set()
if os.path.isfile(design):
    for line in open(design, encoding="utf-8"):
        m = re.match(r"#+\s+(\d+(?:\.\d+)*)[.\s]", line)
        if m:
            sections.add(m.group(1))
refs = []
for f in files:
    for m in re.finditer(r"DESIGN(?:\.md)?\s*§\s*(\d+(?:\.\d+)*)", open(os.path.join(SRC, f), encoding="utf-8").read()):
        if m.group(1) not in sections:
            refs.append(f"{f}: §{m.group(1)}")
check("layers.design_refs", refs,
      f"{len(refs)} reference(s) to sections docs/DESIGN.md does not have: " + "; ".join(refs[:6]))

sys.exit(1 if failed else 0)
