"""The event loop reuses its last scan of the time-sensitive units (EagerMerge, Link) while no unit has stepped
(``kernels.engine.event_loop``): on many chips most HBM events stop at another chip's bound and wake nobody, and
each used to rescan every Link and EagerMerge. Within a scan it also keeps each unit's decision time while neither
the unit nor a unit across one of its channels has stepped (a Link of a 16-chip all-to-all reads hundreds of
inputs). The reuse must be invisible: every result equals that of a run that computes every decision time at
every decision (``run(..., reuse_scans=False)``), and the scans and the decision times computed are counted
(``EngineResult.time_sensitive_scans``, ``time_sensitive_evaluations``) so these tests see that reuse really
happens. A Link computes its decision time, and chooses, from a cached view of its transfers in which only those
whose channels were pushed, popped or closed are looked at again (``kernels.units_link.link_decision_time``); the
run without reuse looks at every transfer at every decision and choice, so the same comparison checks the view.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ref_random_programs import random_program
from shared_traces_folder import require_shared_traces
from small_routing import sixteen_chip_moe_config, write_small_routing

from stepsim.base.errors import DeadlockError, SimulationError
from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.kernels.reference import run as ref_run
from stepsim.workloads.config import workload_from_config


def _outcome(program, **kw):
    """Everything a run reports but its scan count, and the scan count apart (or the failure's text)."""
    try:
        r = api.run(program, record_events=256, **kw)
    except DeadlockError as exc:
        return ("deadlock", str(exc)), None
    except SimulationError as exc:
        return ("error", str(exc)), None
    return (r.cycles, r.events, r.fires, r.bytes_read, r.bytes_written, r.hbm_requests, r.hbm_closed_form_ticks,
            r.unit_counters.tolist(), r.channel_counters.tolist(), r.events_recorded.tolist(),
            r.link_bytes.tolist()), (r.time_sensitive_scans, r.time_sensitive_evaluations)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_multichip_programs_same_with_and_without_reuse(seed):
    program = random_program(seed, links=True)
    reused, scans = _outcome(program)
    rescanned, all_scans = _outcome(program, reuse_scans=False)
    assert reused == rescanned
    if scans is not None:
        assert scans[0] <= all_scans[0] and scans[1] <= all_scans[1]


def test_random_multichip_programs_do_reuse_scans():
    """The property above would hold trivially if no scan or decision time were ever reused: in half of these
    programs some scans are, in 34 of the 40 some decision times (33 before a Link woke only the units across the
    transfers its step changed, clearing fewer decision times)."""
    fewer_scans = fewer_times = 0
    for seed in range(40):
        program = random_program(seed, links=True)
        (reused, scans), (rescanned, all_scans) = _outcome(program), _outcome(program, reuse_scans=False)
        assert reused == rescanned
        fewer_scans += scans is not None and scans[0] < all_scans[0]
        fewer_times += scans is not None and scans[1] < all_scans[1]
    assert (fewer_scans, fewer_times) == (20, 34)


def _small_moe_layer(config: dict) -> tuple:
    """A small MoE layer of ``config`` (hidden 16, intermediate 96, tile_n 4, load-balanced) run with and without
    reuse, which must agree, and on the reference engine, whose unit counters must be the engine's: ``(cycles of the
    reference, the engine's outcome, its (scans, decision times), those without reuse)``."""
    w = workload_from_config({"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 96, "tile_n": 4,
                              "placement": "load-balanced", **config})
    program = lower(w.graph, channel_depth=w.channel_depth)
    (reused, scans), (rescanned, all_scans) = _outcome(program), _outcome(program, reuse_scans=False)
    assert reused == rescanned
    ref = ref_run(program, max_steps=5_000_000)
    np.testing.assert_array_equal(ref.unit_counters, np.array(reused[7]))
    return ref.cycles, reused, scans, all_scans


def test_expert_parallel_time_multiplexed_layer(tmp_path):
    """A small ``--ep 4 --regions 4`` MoE layer on a 4-chip ring: the reference engine agrees, and the engine
    gives the same events (pinned: as before the reuse) with a fraction of the scans and decision times."""
    write_small_routing(tmp_path)
    ref_cycles, reused, scans, all_scans = _small_moe_layer({"experts": 8, "top_k": 2, "regions": 4, "ep": 4,
                                                             "trace": str(tmp_path / "routing.npz"),
                                                             "system": "ring-4"})
    assert (ref_cycles, reused[1], scans, all_scans) == (reused[0], EP4_EVENTS, EP4_SCANS, EP4_ALL_SCANS)


def test_sixteen_chip_all_to_all(tmp_path):
    """A small MoE layer over 16 chips (``--ep 16``, 2 experts a chip): its all-to-all Links read many inputs each,
    the case the kept decision times are for. The reference engine agrees; 4,142 of the 99,446 decision times
    are computed (4.2 %; 5,394 before a Link's step cleared only the decision times across the transfers it
    changed)."""
    ref_cycles, reused, scans, all_scans = _small_moe_layer(sixteen_chip_moe_config(tmp_path))
    assert (ref_cycles, reused[0], reused[1], scans, all_scans) == (8264, 8264, 6082, (1533, 4142), (1637, 99446))


#: the small layer's events (the same on branch int, before the reuse) and its (scans, decision times computed)
#: with and without reuse
EP4_EVENTS, EP4_SCANS, EP4_ALL_SCANS = 1921, (346, 671), (496, 6694)


@pytest.mark.slow
@pytest.mark.traces
def test_qwen3_on_eight_chips_with_time_multiplexed_regions():
    """The bench's ``--ep 8 --regions 8`` layer (bench/test_bench_multichip.py): the counts of branch int (before
    the reuse), and the scans the reuse saves (about 198,000 HBM events wake nobody) and the decision times
    (11.6 million computed without reuse, 11,697 with: a unit's is kept while nothing across its channels steps,
    or, across a Link, while the Link's steps change none of its channels; 18,032 before that)."""
    path = require_shared_traces() / "expert_routing" / "qwen_b64" / "032_012.npz"
    w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "trace": str(path), "ep": 8,
                              "placement": "load-balanced", "regions": 8})
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    (reused, scans), (rescanned, all_scans) = _outcome(program), _outcome(program, reuse_scans=False)
    assert reused == rescanned
    assert reused[:7] == (798776, 228861, 22906, 575931392, 524288, 11002368, 672352)
    assert (scans, all_scans) == ((4702, 11697), (199981, 11557887))
