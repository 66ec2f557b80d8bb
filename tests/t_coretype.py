#!/usr/bin/env python3
"""t_coretype — the benchmarks' choice of OpenBLAS kernels (tools/bench/coretype.py).

OpenBLAS runs whatever OPENBLAS_CORETYPE names, so SkylakeX on an AVX2-only
AMD EPYC died with SIGILL inside the benchmark. The choice is checked here for
CPUs this machine is not, through cpuinfo files the test writes
(BENCH_CPUINFO), and against this machine's OpenBLAS for the names:

  choice.*     auto picks SkylakeX on AVX-512, Zen on an AVX2 AMD, Haswell on an
               AVX2 Intel, Sandybridge on AVX, Prescott on SSE3; a name is taken in
               any letter case; none unsets; --isa avx2 hides AVX-512
  refuse.*     a core type the CPU lacks flags for, an unknown name, or an
               environment OPENBLAS_CORETYPE the CPU cannot run: CoretypeError
               naming the missing flags and what the CPU runs
  script.*     train_throughput.sh and zero_overlap.py with SkylakeX on a Zen 3:
               exit 2 with one line naming avx512f, before anything is built or run
  library.*    each core type this machine supports, set in OPENBLAS_CORETYPE,
               is the one OpenBLAS reports (openblas_get_corename), so the names
               the module uses are the library's
"""
import ctypes.util
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, scratch_dir  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import coretype  # noqa: E402

TMP = scratch_dir("t_coretype")
BASE = "fpu sse sse2 pni ssse3 sse4_1 sse4_2 popcnt"
AVX2 = BASE + " avx f16c avx2 fma bmi1 bmi2"
AVX512 = AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl"
CPUS = {
    # name: (model name, vendor, flags, what auto must pick)
    "zen3": ("AMD EPYC 7B13 64-Core Processor", "AuthenticAMD", AVX2, "Zen"),
    "haswell": ("Intel(R) Xeon(R) CPU E5-2680 v3", "GenuineIntel", AVX2, "Haswell"),
    "skylakex": ("Intel(R) Xeon(R) Gold 6148", "GenuineIntel", AVX512, "SkylakeX"),
    "zen4": ("AMD EPYC 9654 96-Core Processor", "AuthenticAMD", AVX512 + " avx512_bf16", "SkylakeX"),
    "sandybridge": ("Intel(R) Xeon(R) CPU E5-2670", "GenuineIntel", BASE + " avx", "Sandybridge"),
    "old": ("Intel(R) Pentium(R) 4", "GenuineIntel", "fpu sse sse2 pni", "Prescott"),
}


def cpuinfo(name):
    model, vendor, flags, _ = CPUS[name]
    path = os.path.join(TMP, f"{name}.cpuinfo")
    with open(path, "w") as f:
        for n in range(2):
            f.write(f"processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n")
    return path


def refused(fn, *words):
    try:
        fn()
    except coretype.CoretypeError as e:
        text = str(e)
        return all(w in text for w in words) and "\n" not in text, text
    return False, "accepted"


def test_choices():
    for name, (_, _, _, want) in CPUS.items():
        cpu = coretype.read_cpu(cpuinfo(name))
        got = coretype.resolve("auto", cpu)
        check(f"choice.auto_{name}", got == want, f"auto picked {got}, want {want}")
    zen3 = coretype.read_cpu(cpuinfo("zen3"))
    check("choice.any_case", coretype.resolve("haswell", zen3) == "Haswell", coretype.resolve("haswell", zen3))
    check("choice.none_unsets", coretype.resolve("none", zen3) is None, "none did not unset")
    skx = coretype.read_cpu(cpuinfo("skylakex"))
    check("choice.isa_avx2", coretype.resolve("auto", coretype.restrict(skx, "avx2")) == "Haswell",
          coretype.resolve("auto", coretype.restrict(skx, "avx2")))
    ok, why = refused(lambda: coretype.resolve("SkylakeX", coretype.restrict(skx, "avx2")), "avx512f")
    check("choice.isa_avx2_refuses_avx512", ok, why)


def test_refusals():
    zen3 = coretype.read_cpu(cpuinfo("zen3"))
    ok, why = refused(lambda: coretype.resolve("SkylakeX", zen3), "SkylakeX", "avx512f", "AMD EPYC 7B13",
                      "Zen", "--coretype auto")
    check("refuse.skylakex_on_zen3", ok, why)
    ok, why = refused(lambda: coretype.resolve("Cooperlake", coretype.read_cpu(cpuinfo("skylakex"))),
                      "avx512_bf16")
    check("refuse.cooperlake_without_bf16", ok, why)
    ok, why = refused(lambda: coretype.resolve("Skylake", zen3), "'Skylake'", "not a core type", "Haswell")
    check("refuse.unknown_name", ok, why)
    saved = os.environ.get("OPENBLAS_CORETYPE")
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    try:
        ok, why = refused(lambda: coretype.resolve(None, zen3), "OPENBLAS_CORETYPE in the environment", "avx512f")
    finally:
        if saved is None:
            del os.environ["OPENBLAS_CORETYPE"]
        else:
            os.environ["OPENBLAS_CORETYPE"] = saved
    check("refuse.environment_value", ok, why)


def test_scripts():
    env = dict(os.environ, BENCH_CPUINFO=cpuinfo("zen3"))
    env.pop("OPENBLAS_CORETYPE", None)
    marker = os.path.join(ROOT, "build", "bench", "train_throughput.json")
    before = os.path.getmtime(marker) if os.path.exists(marker) else None
    for name, cmd in (("train_throughput", ["bash", os.path.join(ROOT, "tools", "bench", "train_throughput.sh"),
                                            "--coretype", "SkylakeX", "--rounds", "2"]),
                      ("zero_overlap", ["/usr/bin/python3", os.path.join(ROOT, "tools", "bench", "zero_overlap.py"),
                                        "--coretype", "SkylakeX"])):
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        lines = out.stderr.strip().splitlines()
        check(f"script.{name}_refuses", out.returncode == 2 and len(lines) == 1 and "avx512f" in lines[0]
              and "Zen" in lines[0] and not out.stdout.strip(),
              f"status {out.returncode}, stdout {out.stdout[-300:]!r}, stderr {out.stderr[-500:]!r}")
    after = os.path.getmtime(marker) if os.path.exists(marker) else None
    check("script.nothing_ran", before == after, "train_throughput.json was written")


def test_library():
    lib = ctypes.util.find_library("openblas") or "libopenblas.so.0"
    probe = ("import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); l.openblas_get_corename.restype = ctypes.c_char_p; "
             "print(l.openblas_get_corename().decode())")
    names = coretype.supported()
    check("library.some_supported", "Prescott" in names, f"this CPU supports {names}")
    for name in names:
        env = dict(os.environ, OPENBLAS_CORETYPE=name)
        out = subprocess.run(["/usr/bin/python3", "-c", probe, lib], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        check(f"library.{name}", out.returncode == 0 and out.stdout.strip() == name,
              f"OPENBLAS_CORETYPE={name}: OpenBLAS reports {out.stdout.strip()!r} (status {out.returncode})")


if __name__ == "__main__":
    test_choices()
    test_refusals()
    test_scripts()
    test_library()
