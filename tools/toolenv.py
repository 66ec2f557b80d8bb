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
