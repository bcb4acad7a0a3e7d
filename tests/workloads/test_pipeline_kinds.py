"""Which workload kinds take ``--pp`` (pipeline parallelism): one declaration per kind in the registry."""

from __future__ import annotations

from stepsim.workloads.kinds import KINDS


def test_pipeline_parallel_kinds():
    assert sorted(name for name, k in KINDS.items() if "pp" in k.parallel) == ["decoder", "moe", "swiglu"]
