"""Simulate every candidate of the skewed B=1024 search (test_optimize_b1024_skewed.py) without pruning and store
their cycles in ``mixtral_b1024_skewed_exhaustive.json`` beside this script.

The exhaustive search simulates 336 candidates: about 4 minutes on a quiet core, too long to repeat in every test
run. The test reads the stored table and checks that it is today's (the same candidates, the front's cycles equal
to the search's fresh simulations, and the pruned candidates nearest the front simulated again); when it says the
table is stale, run ``python tests/optimize/data/refresh_skewed_exhaustive.py`` from the repository root.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE / "mixtral_b1024_skewed_exhaustive.json"


def main() -> int:
    sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]  # tests/optimize's conftest before tests/' one
    from conftest import SerialExecutor, exhaustive
    from shared_traces_folder import require_shared_traces
    from test_optimize_b1024_skewed import skewed_mixtral_b1024

    from stepsim.base.files import atomic_output
    from stepsim.optimize import optimize

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "mixtral_b1024_skewed.npz"
        skewed_mixtral_b1024(require_shared_traces(), trace)
        result = optimize("moe", out=Path(tmp) / "opt", model="mixtral-8x7b", trace=str(trace),
                          executor=SerialExecutor())
        _, cycles = exhaustive(result)
    table = {"candidates": sorted(c.run_id for c in result.candidate_list), "cycles": dict(sorted(cycles.items()))}
    with atomic_output(TABLE) as tmp_path:
        tmp_path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {TABLE}: {len(cycles)} simulated candidates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
