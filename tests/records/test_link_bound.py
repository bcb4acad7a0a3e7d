"""The link bound (stepsim.analysis.bounds.link_cycles, record column ``link_cycles``): the busiest link's
elements back to back plus its latency, never above a run's cycles; tight on a direct all-to-all (one chunk per
link: sigma + alpha - 1 against the closed form alpha + sigma), 0 without links."""

from __future__ import annotations

import pytest

from stepsim.analysis.bounds import link_cycles
from stepsim.results.records import run_config
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import normalize_config, workload_from_config


@pytest.mark.parametrize("op, algorithm, system, nbytes, bound, cycles", [
    # 3 chunks of 1024 B over each ring link: 3 x 16 cycles + 499 (the Link unit's latency, alpha - 1)
    ("all-gather", "ring-chunked", "ring-4", 4096, 547, 1549),
    ("all-reduce", "ring-chunked", "ring-4", 4096, 595, 3193),  # 6 chunks of 1024 B
    ("all-to-all", "direct", "fully-connected-8", 65536, 627, 628),  # one 8192 B chunk: 128 + 499
    ("all-gather", "direct", "switch-8", 8192, 361, 628),  # an up-link carries 7 chunks of 1024 B: 112 + 249
])
def test_link_bound_on_collectives(op, algorithm, system, nbytes, bound, cycles):
    w = workload_from_config(normalize_config({"workload": "collective", "op": op, "algorithm": algorithm,
                                               "system": system, "bytes": nbytes, "mode": "simulate"}))
    assert (link_cycles(w), simulate(w).cycles, w.params["closed_form_cycles"]) == (bound, cycles, cycles)


def test_link_bound_is_a_record_column():
    row = run_config({"workload": "collective", "op": "all-to-all", "algorithm": "direct",
                      "system": "fully-connected-8", "bytes": 65536, "mode": "metrics"}).row
    assert row["link_cycles"] == 627
    assert run_config({"workload": "swiglu", "mode": "metrics"}).row["link_cycles"] == 0  # one chip: no link


@pytest.mark.parametrize("tp, bound, cycles", [(2, 1523, 18549), (4, 2035, 13381)])
def test_link_bound_on_a_tensor_parallel_layer(tp, bound, cycles):
    """SwiGLU with --tp: the all-reduce after the layer crosses the links; the bound stays below the run."""
    row = run_config({"workload": "swiglu", "tp": tp, "mode": "simulate"}).row
    assert (row["link_cycles"], row["cycles"]) == (bound, cycles)
