#!/usr/bin/env python3
"""rewrite_launches — a .cu file's kernel launches as calls of cudaemu's launcher.

    python3 rewrite_launches.py IN.cu OUT.cc

Each `name<T...><<<grid, block[, smem[, stream]]>>>(args)` becomes
`cudaemu_launch_args("name<T...>", __FILE__, __LINE__, [=](auto... a) { name<T...>(a...); },
std::make_tuple(args), grid, block[, smem[, stream]])`: the arguments are evaluated
at the launch (CUDA copies kernel parameters then), the kernel runs when its
stream reaches it;
everything else is copied unchanged, newlines included, after a #line
directive, so compiler messages and __FILE__/__LINE__ name the original file
and line. A launch it cannot parse stops the rewrite with an error.
"""
import re
import sys


def match_forward(text, i, open_ch, close_ch):
    """Index of the bracket closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced {open_ch} at offset {i}")


def kernel_start(text, end):
    """Start of the kernel name (with template arguments) ending just before `end`."""
    j = end
    while j > 0 and text[j - 1].isspace():
        j -= 1
    if text[j - 1] == ">":  # template arguments: walk back to the matching '<'
        depth = 0
        k = j - 1
        while k >= 0:
            if text[k] == ">":
                depth += 1
            elif text[k] == "<":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        j = k
    m = re.search(r"[A-Za-z_][A-Za-z0-9_:]*\s*$", text[:j])
    if not m:
        raise ValueError(f"no kernel name before <<< at offset {end}")
    return m.start()


def rewrite(text):
    out, pos, count = [], 0, 0
    while True:
        i = text.find("<<<", pos)
        if i < 0:
            break
        start = kernel_start(text, i)
        name = text[start:i].strip()
        close = text.find(">>>", i)
        if close < 0:
            raise ValueError(f"no >>> after <<< at offset {i}")
        config = text[i + 3:close]
        p = close + 3
        while text[p].isspace():
            p += 1
        if text[p] != "(":
            raise ValueError(f"no argument list after >>> at offset {close}")
        end = match_forward(text, p, "(", ")")
        args = text[p + 1:end]
        label = re.sub(r"\s+", "", name)
        out.append(text[pos:start])
        # the arguments are evaluated now, into a tuple; the kernel runs on them later
        out.append(f'cudaemu_launch_args("{label}", __FILE__, __LINE__, '
                   f'[=](auto... cudaemu_a) {{ {name}(cudaemu_a...); }}, std::make_tuple({args}), {config})')
        pos = end + 1
        count += 1
    out.append(text[pos:])
    return "".join(out), count


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    try:
        body, count = rewrite(text)
    except ValueError as e:
        sys.exit(f"rewrite_launches: {src}: {e}")
    with open(dst, "w") as f:
        f.write(f'#line 1 "{src}"\n' + body)
    print(f"rewrite_launches: {src}: {count} launches", file=sys.stderr)


if __name__ == "__main__":
    main()
