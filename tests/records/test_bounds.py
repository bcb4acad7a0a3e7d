"""Lower bounds on cycles without simulating (stepsim.analysis.bounds): each holds unit by unit against the engine.

``stepsim optimize`` drops a candidate when a simulated point beats its lower bound, so a bound above a real run
would silently drop a front point. Every per-unit bound is checked against that unit's counters (final clock
for loads, busy cycles for compute), the whole-run bounds against the cycles, on every workload kind and on the
variants where a per-unit value is not fixed by the graph (dynamic tiles merged in a time-multiplexed region,
requests dispatched to regions during the run).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stepsim.analysis.bounds import (
    compute_unit_bounds,
    compute_unit_cycles,
    cycle_bounds,
    first_output_times,
    hbm_drain_cycles,
    hbm_request_cycles,
    load_unit_bounds,
    load_unit_cycles,
    pipeline_cycles,
    pipeline_unit_bounds,
)
from stepsim.base.hardware import Hardware
from stepsim.models.presets import MoEModel, resolve_model
from stepsim.optimize.pareto import roofline_lower_bound
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import resolve_hardware, workload_from_config
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.moe.build import build_moe

#: bundled synthetic traces (no ../shared needed): every kind, tiling, time-multiplexing and strategy
CONFIGS = {
    "mixtral-dynamic": {"model": "mixtral", "tiling": "dynamic", "tile_f": 512},
    "mixtral-dynamic-2-regions": {"model": "mixtral", "tiling": "dynamic", "tile_f": 512, "regions": 2},
    "mixtral-static-64-1-region": {"model": "mixtral", "tiling": "static", "tile_n": 64, "tile_f": 512,
                                   "regions": 1},
    "qwen-dynamic-4-regions": {"model": "qwen", "tiling": "dynamic", "regions": 4},
    "qwen-dynamic-16-regions-tile-f-48": {"model": "qwen", "tiling": "dynamic", "regions": 16, "tile_f": 48},
    "qwen-static-16": {"model": "qwen", "tiling": "static", "tile_n": 16},
    "qwen-static-32-8-regions": {"model": "qwen", "tiling": "static", "tile_n": 32, "regions": 8},
    "attention-coarse": {"workload": "attention", "strategy": "coarse"},
    "attention-interleave-8": {"workload": "attention", "strategy": "interleave", "regions": 8},
    "attention-dynamic-4": {"workload": "attention", "strategy": "dynamic", "regions": 4},
    "attention-dynamic-16-stable": {"workload": "attention", "strategy": "dynamic", "regions": 16,
                                    "softmax": "stable"},
    "swiglu": {"workload": "swiglu"},
}


def _check_units(workload, sim, hardware) -> None:
    """Every per-unit bound is at most its unit's counter; units whose work is dispatched during the run only
    on average over their counterparts (stepsim.analysis.bounds.busiest_unit)."""
    row = {name: i for i, name in enumerate(sim.unit_names)}
    balanced = [[[n for n in names] for names in regions] for regions in workload.balanced_units]
    in_balanced = {n for regions in balanced for names in regions for n in names}
    for bounds, column in ((load_unit_bounds(workload, hardware), 4), (compute_unit_bounds(workload, hardware), 1)):
        for name, bound in bounds.items():
            if name not in in_balanced:
                assert bound <= sim.unit_counters[row[name], column], name
        for regions in balanced:
            members = [[n for n in names if n in bounds] for names in regions]
            for counterparts in zip(*members):
                mean = sum(bounds[n] for n in counterparts) / len(counterparts)
                assert mean <= max(sim.unit_counters[row[n], column] for n in counterparts), counterparts


def _bounds(workload, hardware) -> tuple[int, int, int, int]:
    return (load_unit_cycles(workload, hardware), compute_unit_cycles(workload, hardware),
            hbm_request_cycles(workload, hardware), pipeline_cycles(workload, hardware))


def _first_busy(sim) -> dict[str, int]:
    """{unit: the start of its first busy interval} in the run's timeline (units never busy are left out)."""
    intervals = sim.timeline.intervals.to_pydict()
    started = {}
    for unit, state, start in zip(intervals["unit"], intervals["state"], intervals["start"]):
        if state == "busy":
            started[unit] = min(started.get(unit, start), start)
    return started


def _check_pipeline(workload, sim, hardware) -> None:
    """Every load or compute unit starts no earlier than all its inputs' first elements can exist, any other
    unit no earlier than one of them (first_output_times): checked against the first busy interval of the
    run's timeline; every pipeline bound is at most its unit's final clock (for units dispatched during the
    run, at most the latest of its counterparts')."""
    first = first_output_times(workload, hardware)
    started = _first_busy(sim)
    assert sim.timeline.complete
    ops = {op.name: op for op in workload.graph.ops}
    bounds = pipeline_unit_bounds(workload, hardware)
    for name, start in started.items():
        # loads and compute units need every operand (their pipeline bound counts from the latest); routing
        # units such as a Reassemble start on whichever input comes first
        arrivals = [first[ref.op.name] for ref in ops[name].inputs]
        assert (max if name in bounds else min)(arrivals, default=0) <= start, name
    row = {name: i for i, name in enumerate(sim.unit_names)}
    final = {name: sim.unit_counters[row[name], 4] for name in row}
    dispatched = {name: [n for names in regions for n in names]
                  for regions in workload.balanced_units for names in regions for name in names}
    for name, bound in bounds.items():
        assert bound <= max(final[n] for n in dispatched.get(name, [name])), name


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_bound_holds_unit_by_unit(name):
    config = {"workload": "moe", **CONFIGS[name]}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    sim = simulate(workload, hardware=hardware, timeline=True)
    _check_units(workload, sim, hardware)
    _check_pipeline(workload, sim, hardware)
    assert max(_bounds(workload, hardware)) <= sim.cycles
    # the record's columns share one evaluation and give the same values
    assert list(cycle_bounds(workload, hardware).values()) == list(_bounds(workload, hardware))
    # the request bound is never below the bytes roofline it refines
    off_chip = workload.metrics()["off_chip_bytes"]
    assert hbm_request_cycles(workload, hardware) >= roofline_lower_bound(off_chip, hardware.hbm_peak_bytes_per_cycle,
                                                                         0, 0)


def test_decoder_with_dynamic_attention_and_time_multiplexed_experts():
    """Both kinds of runtime-dependent per-unit values in one graph: each KV head's dispatcher (balanced_units,
    one entry per head) and the MoE regions' merged dynamic tiles (tile_rows)."""
    model = dataclasses.replace(resolve_model("qwen"), hidden=64, heads=8, kv_heads=2, head_dim=16,
                                expert_intermediate=32, experts=8, top_k=2)
    rng = np.random.default_rng(0)
    routing = np.stack([rng.choice(8, 2, replace=False) for _ in range(32)])
    kv = rng.integers(1, 300, 32)
    workload = build_decoder(model, kv, routing, strategy="dynamic", tiling="dynamic", regions=2, tile_f=16)
    hardware = Hardware.preset(workload.hardware)
    assert [len(regions) for regions in workload.balanced_units] == [4, 4]
    sim = simulate(workload, hardware=hardware, timeline=True)
    _check_units(workload, sim, hardware)
    _check_pipeline(workload, sim, hardware)
    assert max(_bounds(workload, hardware)) <= sim.cycles


def test_exact_values_where_each_bound_is_the_tight_one():
    """(load, compute, hbm requests, pipeline, simulated cycles). The compute bound is within 0.6 % on one
    region of padded static tiles (8 experts x 28 F tiles x 2*64*4096*512 FLOPs at 1024 FLOPs/cycle), the
    request bound within 0.8 % on SwiGLU (8 HBM channels on step-hdl), the load bound within 1.5 % on 4 dynamic
    regions. Qwen3's merged tiles of a few rows are PMU-bound: 1,102,848 cycles where their FLOPs alone give
    457,728. The pipeline bound adds what must pass before the busiest unit's first firing: on the one region
    of padded static tiles, the down projection (as busy as the gate) waits for a 4096 x 512 bf16 weight
    tile's load (65,536 requests, 65,563 cycles), a gate firing (2*64*4096*512 / 1024 = 262,144 cycles) and
    the SwiGLU maps, all after the first tile of tokens exists: an expert's tokens fill one 64-row tile, which
    closes only when the last of the 64 tokens is loaded (64 x 146 cycles = 9,344). The bound is 0.014 % short
    of the run; on 4 dynamic regions it is 1.1 % short."""
    expected = {
        "mixtral-static-64-1-region": (14_684_096, 58_720_256, 2_754_073, 59_057_595, 59_065_966),
        "qwen-dynamic-4-regions": (1_448_128, 1_102_848, 901_937, 1_453_380, 1_470_017),
        "attention-coarse": (40_508, 7_904, 4_133, 40_512, 43_215),
        "swiglu": (10_496, 16_384, 33_041, 32_850, 33_288),
    }
    got = {}
    for name in expected:
        config = {"workload": "moe", **CONFIGS[name]}
        workload = workload_from_config(config)
        hardware = resolve_hardware(config, workload)
        got[name] = (*_bounds(workload, hardware), simulate(workload, hardware=hardware).cycles)
    assert got == expected


MOE_AND_SWIGLU = [name for name in CONFIGS if not name.startswith("attention")]


@pytest.mark.parametrize("name", MOE_AND_SWIGLU)
def test_compute_bound_is_the_busiest_units_busy_cycles(name):
    """Without runtime dispatch, each firing's cost is max(PMU reads of its loaded operand tiles, FLOPs /
    compute_bw) and nothing else on these layers' busiest units: the bound is their busy time exactly."""
    config = {"workload": "moe", **CONFIGS[name]}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    bounds = compute_unit_bounds(workload, hardware)
    busiest = max(bounds, key=lambda n: (bounds[n], n))
    sim = simulate(workload, hardware=hardware)
    assert bounds[busiest] == sim.unit_counters[sim.unit_names.index(busiest), 1]


def test_pmu_reads_bound_small_merged_tiles(shared_traces):
    """Mixtral B=64, dynamic tiles, one time-multiplexed region, tile_f 64: a firing reads a 4096 x 64 bf16
    weight tile from the PMU in 8,192 cycles (64 B/cycle) and multiplies a tile of b rows in 512 * b, so the
    experts with fewer than 16 tokens (counts 13, 10, 17, 14, 17, 10, 24, 23) cost 16 rows each: 224 F tiles x
    512 x 145 = 16,629,760 busy cycles, exactly the engine's, where the FLOPs alone give 128 rows' 14,680,064."""
    trace = shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz"
    config = {"workload": "moe", "model": "mixtral-8x7b", "trace": str(trace), "tiling": "dynamic", "tile_f": 64,
              "regions": 1}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    bandwidth = {op.name: getattr(op, "compute_bw", None) for op in workload.graph.ops}
    flops_only = max(f / bandwidth[name] for name, f in workload.op_flops().items())
    sim = simulate(workload, hardware=hardware)
    busy = int(sim.unit_counters[:, 1].max())
    assert (flops_only, compute_unit_cycles(workload, hardware), busy, sim.cycles) == \
        (14_680_064, 16_629_760, 16_629_760, 16_673_010)


def test_merged_dynamic_tiles_count_their_exact_flops():
    """A time-multiplexed region's merged dynamic tiles are sized by its largest member tile (bindings), but
    their FLOPs use the mean rows (tile_rows), so the per-operator FLOPs are exactly what the engine
    charges: for each of the B * top_k = 128 token-expert pairs, the gate, up and down matmuls (6*D*F), SiLU
    (8*F), the gate*up product (F), the routing-weight scale (D) and the sum over the slots (D)."""
    config = {"workload": "moe", **CONFIGS["mixtral-dynamic-2-regions"]}
    workload = workload_from_config(config)
    d, f, pairs = 4096, 14336, 64 * 2
    exact = sum(workload.op_flops().values())
    assert exact == pairs * (6 * d * f + 8 * f + f + d + d) == 45_114_720_256
    assert sum(v[2] for v in workload.op_values().values()) == 64_851_951_616  # the sizing bindings over-count


def test_dynamic_attention_load_bound_uses_the_regions_mean(shared_traces):
    """B=64 dynamic parallelization: the round-robin assignment the metrics use gives one region 40,836 cycles
    of K-cache tiles, more than the whole run (39,961): the dispatcher balanced it. The bound uses the mean
    over the regions (36,326), which every run must reach in its busiest region."""
    trace = sorted((shared_traces / "kv_lengths" / "b64").glob("*.npy"))[0]
    config = {"workload": "attention", "trace": str(trace), "strategy": "dynamic", "regions": 4}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    nominal = max(load_unit_bounds(workload, hardware).values())
    sim = simulate(workload, hardware=hardware)
    assert (int(nominal), load_unit_cycles(workload, hardware), sim.cycles) == (40_836, 36_326, 39_961)
    _check_units(workload, sim, hardware)


def test_pipeline_bound_prunes_by_the_fill_of_large_weight_tiles(shared_traces):
    """Mixtral B=64, dynamic tiles on 4 time-multiplexed regions, tile_f 256: region 3's down projection is
    busy 5,390,336 cycles (the compute bound, exactly), but cannot fire before its operands exist. A dynamic
    tile closes only when the token stream ends: the 64 token rows (128 requests each, one in flight: 146
    cycles a row) are loaded no earlier than 9,344, so the region's first merged tile, and with it the first
    weight address, comes at 9,349 or later. A 4096 x 256 bf16 weight tile is then loaded (32,768 requests:
    ready at 42,136), and the gate fires once on the smallest merged tile (23 rows: 2*23*4096*256 / 1024 =
    47,104 cycles) and the SwiGLU maps after it (46 + 9 cycles): 89,295. The run's first down-projection
    firing is at 91,480 (its weight loads start at 9,482, and the first tile has 24 rows), and it ends at
    5,491,035. The bound is above 5,419,308, the cycles of the front point that beats this candidate in
    `stepsim optimize` (dynamic tile_f 32 on 4 regions)."""
    trace = shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz"
    config = {"workload": "moe", "model": "mixtral-8x7b", "trace": str(trace), "tiling": "dynamic", "tile_f": 256,
              "regions": 4}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    first = first_output_times(workload, hardware)
    down = workload.graph.op("MapAccum_87")
    sim = simulate(workload, hardware=hardware, timeline=True)
    _check_pipeline(workload, sim, hardware)
    assert ([first[ref.op.name] for ref in down.inputs], compute_unit_bounds(workload, hardware)[down.name],
            pipeline_cycles(workload, hardware), sim.cycles) == ([89_295, 42_136], 5_390_336, 5_479_631, 5_491_035)


def test_hbm_drain_bound_adds_the_last_weight_tiles_firing(shared_traces):
    """Qwen3 B=64, static tile_n 32, tile_f 256, a region per expert: memory-bound. The weight loads make
    8,994,816 of the 64-byte requests, so the busiest of 32 channels serves at least 281,088 of them, 2 cycles
    apart. None of them can start before the first tile of an expert's tokens closes: with 32 tokens or fewer
    (every expert but one) only once every token is loaded (64 rows of 64 requests, one in flight: 82 cycles a
    row, 5,248), and expert 104, with 42 tokens, closes its first tile once its 33rd token (row 52 of the batch)
    is loaded, since the Reshape looks at the next row before it closes a chunk: 53 x 82 = 4,346. So the weight
    loads start at 4,348 (expert 104's three) and 5,250 (the other 381); the run's first weight requests come 70
    cycles later. The last request starts no earlier than 4,348 + 2 + 281,087 x 2 = 566,524, its response
    reaches the load 17 cycles later and the tile its consumer one cycle after that, and every Map or MapAccum
    firing on a 2048 x 256 bf16 weight tile reads it from the PMU in 16,384 cycles: 582,926. The request bound (every request, stores
    included, from tick 2, and no firing after) is 562,993; the run takes 628,841. The bound is above the
    571,459 cycles of the front point that beats this candidate (tile_n 64, tile_f 32)."""
    trace = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    config = {"workload": "moe", "model": "qwen3-30b-a3b", "trace": str(trace), "tiling": "static", "tile_n": 32,
              "tile_f": 256}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    sim = simulate(workload, hardware=hardware, timeline=True)
    _check_pipeline(workload, sim, hardware)
    first = first_output_times(workload, hardware)
    weight_loads = [op for op in workload.graph.ops if op.kind == "LinearOffChipLoad" and op.inputs]
    starts = {}
    for op in weight_loads:
        starts.setdefault(max(first[ref.op.name] for ref in op.inputs), []).append(op.group[1])
    assert {start: (len(experts), set(experts)) if len(experts) < 4 else len(experts)
            for start, experts in starts.items()} == {4_348: (3, {104}), 5_250: 381}
    first_busy = _first_busy(sim)
    assert (min(first_busy[op.name] for op in weight_loads if op.group == ("expert", 104)),
            min(first_busy.get(op.name, sim.cycles) for op in weight_loads
                if op.group != ("expert", 104))) == (4_418, 5_320)
    assert (hbm_request_cycles(workload, hardware), hbm_drain_cycles(workload, hardware),
            pipeline_cycles(workload, hardware), sim.cycles) == (562_993, 582_926, 582_926, 628_841)


@pytest.mark.parametrize("regions, shared", [(None, 0), (2, 0), (None, 64)])
def test_an_experts_first_tile_waits_for_the_token_after_it(regions, shared):
    """Static tiles of 4 tokens, 24 skewed tokens over 4 experts (top-2), FIFOs deep enough not to deadlock: an
    expert with more than 4 tokens closes its first tile only when its 5th token arrives (the Reshape looks at
    it before it closes the chunk), and that token is row ``p`` of the batch, loaded no earlier than ``(p + 1)``
    token-load tile times. The packing Accum's first output is bounded by exactly that plus its firing and one
    cycle; an expert with at most 4 tokens waits for the whole batch. The shared expert's tiles (no outer dim
    added) close on their 4th row. Every unit's first busy cycle and final clock respect the bounds."""
    model = MoEModel("tiny", hidden=64, intermediate=64, experts=4, top_k=2, shared_intermediate=shared)
    rng = np.random.default_rng(7)
    routing = np.stack([rng.choice(4, 2, replace=False, p=[0.5, 0.3, 0.15, 0.05]) for _ in range(24)])
    workload = build_moe(model, routing, tiling="static", tile_n=4, tile_f=32, regions=regions, channel_depth=16)
    hardware = Hardware.preset(workload.hardware)
    first = first_output_times(workload, hardware)
    # a 1 x 64 bf16 row: 128 bytes, two requests dispatched one per tick, then the HBM's start-up and latency
    per_row = -(-128 // hardware.addr_offset) + hardware.hbm_start_up + hardware.hbm_latency + 2
    accums = [op for op in workload.graph.ops if op.kind == "Accum" and op.group and op.group[0] == "expert"]
    expected = {}
    for op in accums:
        rows = np.flatnonzero((routing == op.group[1]).any(axis=1))
        close = (rows[4] + 1) * per_row if len(rows) > 4 else len(routing) * per_row
        expected[op.name] = close + 1  # the RetileRow firing costs no FLOPs, then the emission
    assert {op.name: first[op.name] for op in accums} == expected
    assert sorted(len(np.flatnonzero((routing == e).any(axis=1))) for e in range(4)) == [3, 10, 16, 19]
    if shared:
        [packing] = [op for op in workload.graph.ops if op.kind == "Accum" and op.group == ("shared_expert", 0)]
        assert first[packing.name] == 4 * per_row + 1
    sim = simulate(workload, hardware=hardware, timeline=True)
    _check_units(workload, sim, hardware)
    _check_pipeline(workload, sim, hardware)
    assert max(_bounds(workload, hardware)) <= sim.cycles
