"""Compile the engine's kernels once, before the test workers start (tests/conftest.py, ``pytest -n``).

On a cold numba cache (a fresh clone) every kind of run compiles its specialization of the event loop on first
use, about a minute each: timing, functional and timeline runs, and the serving replay's loop. Left to the tests,
each worker compiles what its first such test needs, so both workers compile the same kernels at the same time,
and the commands the tests start in subprocesses compile again whatever the cache lacks when they start. Here
four processes fill the cache first, in parallel (the timing, the functional and the timeline specializations,
and the replay loop), then every test loads the compiled code. A kernel already cached costs a glance at numba's
index (a last process checks every part once all are done); a kernel these processes failed to compile is
compiled by its first test as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the warm-up processes: each compiles what the cache lacks (stepsim.cli.cache's `stepsim cache warm`, split in
#: four run in parallel: 164 s on a fresh clone with 2 cores, against 181 s in three, the timeline with the replay
#: loop)
PARTS = (
    """
from stepsim.kernels.jit import kernels_cached
from stepsim.kernels.api import run
from stepsim.kernels.warm import warm_program
if not kernels_cached():
    run(warm_program())
""",
    """
from stepsim.kernels.jit import kernels_cached
from stepsim.kernels.api import _engine, _ensure_compiled
if not kernels_cached(functional=True):
    _ensure_compiled(_engine(functional=True), functional=True)
""",
    """
from stepsim.kernels.jit import kernels_cached
from stepsim.kernels.api import run
from stepsim.kernels.warm import warm_program
if not kernels_cached(timeline=True):
    run(warm_program(), timeline=1 << 12)
""",
    """
import stepsim.serve.replay_compiled as replay
if not replay._cached():
    replay.warm()
""",
)


def warm_kernels() -> None:
    """Run :data:`PARTS` in parallel on the stepsim under test and wait for them (their output is dropped: a
    failure here leaves the compilation to the tests, which report it)."""
    if os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        return
    root = str(Path(__file__).resolve().parents[1])  # the stepsim under test, as the tests import it
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "STEPSIM_SERVER": "off"}
    procs = [subprocess.Popen([sys.executable, "-c", part], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for part in PARTS]
    for proc in procs:
        proc.wait()
    # they all saved the event loop's cache index: numba reads it, adds its entry and writes it back, so two saves at
    # the same moment can drop one entry; the parts again, one after the other, compile only what is missing
    subprocess.run([sys.executable, "-c", "\n".join(PARTS)], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
