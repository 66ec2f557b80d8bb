"""toolenv — where shardlm's Python tools find their packages.

A tool started by any interpreter (the `python3` first on PATH may not see
Debian's numpy and h5py) calls use_venv() before its imports: when one of the
modules it needs is missing, the tool is started again, once, with the Python
of build/data-venv (or build/ref5-venv, build/ref-venv), which tools/deps.sh
makes.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = ("data-venv", "ref5-venv", "ref-venv")  # prepare_data.py says why in this order


def use_venv(tool, script, modules, venvs=VENVS):
    """Returns when every module of MODULES imports here; else re-executes SCRIPT (the tool's own file)
    in the first venv of VENVS that exists, or prints one line naming the missing module and exits 2."""
    try:
        for m in modules:
            __import__(m)
        return
    except ImportError as e:
        missing = e.name
    mark = "SHARDLM_VENV_" + tool.upper()
    if not os.environ.get(mark):
        for name in venvs:
            py = os.path.join(ROOT, "build", name, "bin", "python")
            if os.path.exists(py):
                os.environ[mark] = py
                os.execv(py, [py, os.path.abspath(script)] + sys.argv[1:])
    where = os.environ.get(mark) or os.path.join(ROOT, "build", venvs[0])
    print(f"{tool}: Python module {missing} is missing ({sys.executable}, {where}); run tools/deps.sh "
          "(make deps)", file=sys.stderr)
    sys.exit(2)


REF5_VENV = os.path.join(ROOT, "build", "ref5-venv")


def ref5_env(base=None):
    """The environment build/ref5-venv's Python needs (BASE, default os.environ, with more): LD_LIBRARY_PATH with
    /usr/local/cuda/lib and the lib folders of the CUDA wheels PyPI's torch 2.11 imports (tools/deps.sh --test,
    ref5_venv)."""
    import glob
    base = os.environ if base is None else base
    libs = ["/usr/local/cuda/lib"] + sorted(glob.glob(os.path.join(REF5_VENV, "lib", "python3*", "site-packages",
                                                                  "nvidia", "*", "lib")))
    old = base.get("LD_LIBRARY_PATH")
    # USE_HUB_KERNELS=0: transformers 5 otherwise asks for the `kernels` package (Hub-downloaded kernels) in
    # every from_pretrained; HF_HUB_OFFLINE: nothing is fetched
    return dict(base, LD_LIBRARY_PATH=":".join(libs + ([old] if old else [])), USE_HUB_KERNELS="0",
                HF_HUB_OFFLINE="1")
