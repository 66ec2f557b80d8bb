"""coretype — which OpenBLAS x86-64 kernels (OPENBLAS_CORETYPE) this CPU can run.

OpenBLAS obeys OPENBLAS_CORETYPE without checking the CPU: SkylakeX on an
AVX2-only AMD EPYC dies with SIGILL in its first sgemm. The benchmarks of
tools/bench/ set one core type for both sides of a comparison, so they ask
this module first:

  resolve(choice)  -> the name to put in OPENBLAS_CORETYPE, or None to unset it
      choice None     the environment's OPENBLAS_CORETYPE (checked), else "auto"
      "auto"          the best kernels the CPU's flags allow (best_coretype)
      "none"          unset: OpenBLAS's own detection, which falls back to the
                      generic Prescott kernels on CPUs newer than the library
      a core name     that one (any letter case), if the CPU has its flags
  and raises CoretypeError, whose text is one line naming the missing flags
  and the core types this CPU supports, for a name it cannot run or does not
  know.

The flags are /proc/cpuinfo's (the kernel drops AVX flags the OS does not
enable). BENCH_CPUINFO=FILE reads another CPU's cpuinfo instead, so the choice
can be tested for CPUs the test machine is not.

Run as a script it prints the CPU, every core type it supports and the one
"auto" picks.
"""
import os
import sys

# Core type -> the cpuinfo flags its kernels use (from the ISA each OpenBLAS
# x86-64 kernel set is written for; "pni" is cpuinfo's name for SSE3). Only
# the kernel sets Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) builds and that a
# benchmark might want are listed; "Zen" runs the Haswell kernels with Zen's
# blocking sizes.
_SKYLAKEX = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma")
REQUIRES = {
    "Prescott": ("pni",),
    "Core2": ("pni", "ssse3"),
    "Nehalem": ("pni", "ssse3", "sse4_1", "sse4_2"),
    "Sandybridge": ("avx",),
    "Haswell": ("avx", "avx2", "fma"),
    "Zen": ("avx", "avx2", "fma"),
    "SkylakeX": _SKYLAKEX,
    "Cooperlake": _SKYLAKEX + ("avx512_bf16",),
}
# Best first: what "auto" tries, in order (Haswell's kernels with Zen's
# blocking on AMD and Hygon CPUs, as OpenBLAS's own detection does).
_PREFERENCE = ("SkylakeX", "Haswell", "Sandybridge", "Nehalem", "Core2", "Prescott")


class CoretypeError(ValueError):
    pass


def read_cpu(path=None):
    """(model name, vendor, set of flags) of the first CPU in a cpuinfo file."""
    path = path or os.environ.get("BENCH_CPUINFO") or "/proc/cpuinfo"
    model, vendor, flags = "unknown CPU", "", set()
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name" and model == "unknown CPU":
                model = value
            elif key == "vendor_id" and not vendor:
                vendor = value
            elif key == "flags" and not flags:
                flags = set(value.split())
    return model, vendor, flags


def restrict(cpu, isa):
    """CPU as the benchmarks see it under --isa ISA: "avx2" hides the AVX-512 flags (an AVX-512
    machine measuring what an AVX2-only one runs); "native" changes nothing."""
    if isa in (None, "native"):
        return cpu
    if isa != "avx2":
        raise CoretypeError(f"--isa {isa!r}: choose native or avx2")
    model, vendor, flags = cpu
    return (f"{model}, AVX-512 hidden by --isa avx2", vendor, {f for f in flags if not f.startswith("avx512")})


def supported(cpu=None):
    """Core types whose flags the CPU has, in the order of REQUIRES."""
    _, _, flags = cpu or read_cpu()
    return [name for name, need in REQUIRES.items() if flags.issuperset(need)]


def best_coretype(cpu=None):
    cpu = cpu or read_cpu()
    ok = supported(cpu)
    amd = cpu[1] in ("AuthenticAMD", "HygonGenuine")
    for name in _PREFERENCE:
        if name in ok:
            return "Zen" if name == "Haswell" and amd else name
    raise CoretypeError(f"{cpu[0]} has none of the x86-64 flags OpenBLAS's kernels need (not even SSE3); "
                        "run the benchmark with --coretype none")


def describe(cpu=None):
    """One line naming the CPU and its widest vector extension, for a benchmark's report."""
    model, _, flags = cpu or read_cpu()
    isa = ("AVX-512" if "avx512f" in flags else "AVX2 + FMA" if {"avx2", "fma"} <= flags
           else "AVX" if "avx" in flags else "SSE")
    return f"{model} ({isa}, {os.cpu_count()} CPUs)"


def resolve(choice=None, cpu=None):
    """The OPENBLAS_CORETYPE value for CHOICE (see the module comment), or None to unset it."""
    cpu = cpu or read_cpu()
    from_env = choice is None
    if from_env:
        choice = os.environ.get("OPENBLAS_CORETYPE") or "auto"
    if choice.lower() in ("auto", ""):
        return best_coretype(cpu)
    if choice.lower() == "none":
        return None
    names = {n.lower(): n for n in REQUIRES}
    where = "OPENBLAS_CORETYPE in the environment" if from_env else "--coretype"
    ok = supported(cpu)
    if choice.lower() not in names:
        raise CoretypeError(f"{where} {choice!r} is not a core type this benchmark knows; this CPU "
                            f"({cpu[0]}) runs: {', '.join(ok)} (or auto, none)")
    name = names[choice.lower()]
    missing = [f for f in REQUIRES[name] if f not in cpu[2]]
    if missing:
        raise CoretypeError(f"{where} {name} needs the CPU flags {', '.join(missing)}, which this CPU "
                            f"({cpu[0]}) lacks (OpenBLAS would die with SIGILL); it runs: {', '.join(ok)}; "
                            f"use --coretype auto for the best of them ({best_coretype(cpu)})")
    return name


def apply(env, choice=None, isa="native"):
    """Sets (or unsets) OPENBLAS_CORETYPE in the dict ENV for CHOICE; returns the value or '(unset)'.
    A choice the CPU cannot run ends the program with a one-line error and status 2."""
    try:
        value = resolve(choice, restrict(read_cpu(), isa))
    except CoretypeError as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2)
    if value is None:
        env.pop("OPENBLAS_CORETYPE", None)
        return "(unset)"
    env["OPENBLAS_CORETYPE"] = value
    return value


def main():
    cpu = read_cpu()
    print(f"cpu: {describe(cpu)}")
    print(f"core types it runs: {', '.join(supported(cpu))}")
    print(f"auto: {best_coretype(cpu)}")
    if len(sys.argv) > 1:
        try:
            print(f"{sys.argv[1]}: {resolve(sys.argv[1], cpu)}")
        except CoretypeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
