"""The program's own process (``stepsim ...``) and the test suite's, tuned: Python's cyclic garbage collector and
sympy's cache (:func:`tune_process`).

stepsim's Python side allocates millions of small objects that live long (sympy expressions of the symbolic
metrics, graph nodes and streams, numba's and pyarrow's modules), and CPython's default thresholds (700, 10, 10)
collect the youngest generation every 700 allocations and walk the older ones every 7,000 and 70,000: the walks
grow with everything alive. Measured on tests/workloads/test_moe_ep_cost.py with test_decoder_pipeline.py (47
tests that build and simulate sharded MoE layers and decoder stacks; 2026-11-28, AMD EPYC Zen 3, 2 cores, load ~1):
53.5-58.3 s with the defaults, 50.1 s at (50,000, 10, 10), 46.5-47.1 s at :data:`GC_THRESHOLDS`, 44.1-44.5 s at
(100,000, 50, 1,000); peak memory 315 MB, 368 MB, 439-462 MB and 549 MB. Garbage cycles are still found, just in
larger batches; no result depends on when (refcounting frees everything else at once).

sympy keeps the expressions it built last in a cache of 1,000 entries by default (``SYMPY_CACHE_SIZE``), and a
graph of a large layer re-creates equal expressions (its streams' dims) long after they fell out of it: each is then
built again, and every later lookup of it compares two equal trees structurally. At :data:`SYMPY_CACHE_SIZE` an
expert-parallel schedule search of the mapper (Qwen3-30B-A3B, 8 tokens on ``ring-2``) took 0.88 of its wall time,
peak memory unchanged (bench/README.md, session 50). sympy reads the variable when it is first imported, so it is
set in the environment before that (the commands import sympy on first use) and the processes started later (a
pool's forkserver, which imports sympy ahead) inherit it; a value the user set is kept. A cache never changes a
value: sympy's expressions are immutable.

Only stepsim's own processes set them: the program (``stepsim ...``), its command server, the local pool's workers
(:func:`stepsim.batch.tasks.init_local_worker`) and the test suite's. A library never changes the collector of the
process that imports it (an in-process caller of :func:`stepsim.cli.main` keeps its own).
"""

from __future__ import annotations

import gc
import os

#: the collector's thresholds: the youngest generation collected every 50,000 allocations (not 700), the middle
#: one every 50 of those, the oldest every 1,000 of the middle's (CPython also waits until a quarter of what the
#: oldest holds is new since its last walk)
GC_THRESHOLDS = (50_000, 50, 1_000)


#: entries of sympy's cache in stepsim's own processes (sympy's default: 1,000)
SYMPY_CACHE_SIZE = 100_000


def tune_process() -> None:
    """Set :data:`GC_THRESHOLDS` for this process and, unless the environment has one, ``SYMPY_CACHE_SIZE`` to
    :data:`SYMPY_CACHE_SIZE` for the sympy this process imports later and for the processes it starts."""
    gc.set_threshold(*GC_THRESHOLDS)
    os.environ.setdefault("SYMPY_CACHE_SIZE", str(SYMPY_CACHE_SIZE))
