"""What a stepsim command does to its own process at start-up and exit (stepsim/kernels/target.py, stepsim/cli.py)."""

import json
import subprocess
import sys

#: run the command as the program (argv None), then report what the process holds
PROGRAM = """
import io, contextlib, gc, json, sys
sys.argv = ["stepsim", "run", "swiglu", "--json"]
from stepsim.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main()
import numba.np.arraymath as arraymath
print(json.dumps({"status": status, "scipy_linalg": "scipy.linalg" in sys.modules, "blas": arraymath._HAVE_BLAS,
                  "frozen": gc.get_freeze_count() > 0, "cycles": json.loads(out.getvalue())["cycles"]}))
"""

IN_PROCESS = """
import io, contextlib, json, sys
from stepsim.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(["run", "swiglu", "--json"])
print(json.dumps({"status": status, "scipy_linalg": "scipy.linalg" in sys.modules,
                  "cycles": json.loads(out.getvalue())["cycles"]}))
"""


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_command_skips_numbas_blas_probe_and_freezes_before_exit():
    program = _run(PROGRAM)
    assert program == {"status": 0, "scipy_linalg": False, "blas": False, "frozen": True,
                       "cycles": program["cycles"]}
    # an in-process caller keeps numba's own set-up (its BLAS probe imports scipy.linalg); same cycles
    assert _run(IN_PROCESS) == {"status": 0, "scipy_linalg": True, "cycles": program["cycles"]}
