"""Lines of the parallel code (issue 43: "the parallel code is at most half of today's lines"), counted over a named
list, so the claim can be checked on any tree.

The list (:data:`PARALLEL`) holds every module whose whole text is the many-chip forms (the sharding pass, the
systems and collectives it inserts, the MoE layer's expert placement, cost model and all-to-all, the per-kind
hooks and the stack builders, present or removed) and, in a kind's ``build.py``, the functions that build its
many-chip forms. A path absent from the tree counts 0 (a removed file); a function named but absent counts 0. Lines
are physical lines (docstrings and comments included), a function's from its first decorator to its last line.

Usage::

    python bench/parallel_lines.py [ROOT ...]     # default: this checkout; one total per ROOT

(ROOT: a checkout, e.g. ``git worktree add /tmp/base 88d3720~1``: the tree issue 43 was filed against, the last
before the sharding pass.)

The per-combination files the issue names (``pipeline_ep``, ``pipeline_tp``, the decoder's ``parallel`` and
``expert_parallel``) were left out of this list until 2026-11-27 (it was written after they were gone, and its
baseline taken at 95795bf, 2,499 lines); on the tree the issue was filed against (88d3720~1) they are 850 of its
2,762 lines.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: path relative to the checkout -> None (every line) or the names of its top-level functions that count
PARALLEL: dict[str, tuple[str, ...] | None] = {
    "stepsim/workloads/sharding.py": None,
    "stepsim/workloads/chips.py": None,
    "stepsim/workloads/moe/many_chips.py": None,
    "stepsim/workloads/moe/parallel.py": None,
    "stepsim/workloads/moe/ep_cost.py": None,
    "stepsim/workloads/moe/sharded.py": None,
    "stepsim/workloads/moe/sharded_micro.py": None,
    "stepsim/workloads/moe/pipeline.py": None,
    "stepsim/workloads/moe/pipeline_ep.py": None,
    "stepsim/workloads/moe/pipeline_tp.py": None,
    "stepsim/workloads/decoder/many_chips.py": None,
    "stepsim/workloads/decoder/pipeline.py": None,
    "stepsim/workloads/decoder/parallel.py": None,
    "stepsim/workloads/decoder/expert_parallel.py": None,
    "stepsim/workloads/decoder/pipeline_ep.py": None,
    "stepsim/workloads/decoder/pipeline_tp.py": None,
    "stepsim/workloads/swiglu/parallel.py": None,
    "stepsim/workloads/swiglu/pipeline.py": None,
    "stepsim/workloads/decoder/build.py": ("_stack", "_tp_stack", "_stack_partial",
                                           # moved from the removed decoder/pipeline.py: counted, so a move saves
                                           # nothing (though q / k / v projections are the layer's, not parallel)
                                           "check_pipeline", "_stack_heads", "input_tiles", "_project",
                                           "qkv_streams"),
    # moved from the removed swiglu/pipeline.py and swiglu/parallel.py
    "stepsim/workloads/swiglu/build.py": ("_stack", "_tp"),
    # moved from the removed moe/pipeline.py (a stack's routing per layer from a trace, also one chip's)
    "stepsim/workloads/routing.py": ("layer_routings", "_layers_array", "_split_layers"),
}


def lines_of(root: Path, path: str, functions: tuple[str, ...] | None) -> int:
    """The counted lines of one entry of :data:`PARALLEL` under ``root`` (0 when the file is absent)."""
    file = root / path
    if not file.is_file():
        return 0
    text = file.read_text()
    if functions is None:
        return len(text.splitlines())
    total = 0
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            total += node.end_lineno - first + 1
    return total


def count(root: Path) -> dict[str, int]:
    """``{path: lines}`` of every entry of :data:`PARALLEL` under ``root``."""
    return {path: lines_of(root, path, functions) for path, functions in PARALLEL.items()}


def main(argv: list[str]) -> int:
    for root in argv or [str(Path(__file__).resolve().parents[1])]:
        per_file = count(Path(root))
        for path, n in per_file.items():
            print(f"{n:6d}  {path}" if n else f"{'-':>6}  {path} (absent)")
        print(f"{sum(per_file.values()):6d}  total ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
