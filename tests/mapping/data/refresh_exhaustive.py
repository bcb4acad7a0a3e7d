"""Simulate every candidate of the mapper's optimality cases (test_mapper.py's ``EXHAUSTIVE_CASES``) without pruning
and store each case's rows in ``exhaustive_<case>.json`` beside this script.

The exhaustive enumerations take about two minutes together (the MoE case's 64 s, the dense FFN's 30 s, on a quiet
core), too long to repeat in every test run. The test runs the mapper's own pruned search and checks the table is
today's before it trusts it: the key (the hash of what a schedule depends on, sources included, as the mapping
cache's key), the same candidates in the same order, every candidate the search simulated equal to the table's
cycles, and the pruned candidates nearest the optimum simulated again. When it says a table is stale, run
``python tests/mapping/data/refresh_exhaustive.py`` from the repository root (one process a case, in parallel).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cases() -> dict:
    sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]  # test_mapper.py and the tests' shared helpers
    from test_mapper import EXHAUSTIVE_CASES

    return EXHAUSTIVE_CASES


def table(case: str) -> dict:
    """The stored form of ``case``'s exhaustive enumeration: its key, its best knobs, its status counts and every
    candidate's knobs, status and cycles in space order."""
    from test_mapper import SN40L

    from stepsim.base.files import stable_hash
    from stepsim.mapping.mapper import evaluate, key_material

    kind, size, dims = _cases()[case][:3]
    schedule, rows = evaluate(kind, size, dims, SN40L, exhaustive=True)
    return {"key": stable_hash(key_material(kind, size, dims, SN40L)), "knobs": schedule.knobs,
            "candidates": schedule.candidates,
            "rows": [{"knobs": r["knobs"], "status": r["status"], "cycles": r["cycles"]} for r in rows]}


def main() -> int:
    from stepsim.base.files import atomic_output

    cases = list(_cases())
    with ProcessPoolExecutor() as pool:
        tables = dict(zip(cases, pool.map(table, cases)))
    for case, data in tables.items():
        path = HERE / f"exhaustive_{case}.json"
        with atomic_output(path) as tmp:
            tmp.write_text(json.dumps(data, indent=None, separators=(",", ":")).replace('},{', '},\n{') + "\n")
        print(f"wrote {path}: {len(data['rows'])} candidates, {data['candidates']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
