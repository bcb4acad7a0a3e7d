"""Engine behaviour beyond the §9 scenarios: deadlocks, determinism, counters, limits, stop levels."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from kernel_helpers import builder, fork_join_program

from stepsim.base.errors import ConfigError, DeadlockError, LoweringError, SimulationError
from stepsim.base.hardware import Hardware
from stepsim.kernels import abi, run
from stepsim.kernels.warm import warm_program


# ------------------------------------------------------------------------------------------------ deadlocks
def test_cycle_without_initial_tokens_raises_deadlock_naming_both_units():
    b = builder()
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    b.map(ins=[x], out=y, fn="exp", name="first")
    b.map(ins=[y], out=x, fn="exp", name="second")
    with pytest.raises(DeadlockError) as info:  # how fast: bench/test_bench_deadlock.py
        run(b.build())
    blocked = {(e.unit, e.channel, e.waiting_for) for e in info.value.blocked}
    assert blocked == {("first", "x", "empty"), ("second", "y", "empty")}
    assert "'x' (empty, 0/2)" in str(info.value)


def test_too_shallow_fifo_on_a_reconvergent_path_deadlocks():
    """Broadcast feeds a direct branch (depth 2) and a Bufferize->Streamify branch that needs all 8 tiles."""
    with pytest.raises(DeadlockError) as info:  # how fast: bench/test_bench_deadlock.py
        run(fork_join_program())
    blocked = {e.unit: (e.channel, e.waiting_for, e.occupancy, e.capacity)
               for e in info.value.blocked}
    assert blocked["fanout"] == ("direct", "full", 2, 2)
    assert blocked["join"] == ("replay", "empty", 0, 2)
    assert blocked["bufferize"][:2] == ("to_buffer", "empty")
    assert blocked["streamify"][:2] == ("buf", "empty")
    assert blocked["load"][:2] == ("src", "full")


def test_the_same_reconvergent_path_runs_with_a_deep_enough_fifo():
    b = builder()
    src, buffered, buf, replay, out = (b.add_channel() for _ in range(5))
    direct = b.add_channel(capacity=8)
    b.offchip_load(out=src, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(8,))
    b.broadcast(inp=src, outs=[direct, buffered])
    b.bufferize(inp=buffered, out=buf, rank=1)
    b.streamify(inp=buf, out=replay, rank=1)
    b.map(ins=[direct, replay], out=out, fn="add", compute_bw=64)
    sink = b.sink(inp=out)
    r = run(b.build())
    assert r.unit_counters[sink, abi.CNT_FIRES] == 8


def test_max_events_stops_the_engine():
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(1000,))
    b.map(ins=[x], out=y, fn="exp")
    b.sink(inp=y)
    with pytest.raises(SimulationError, match="max_events"):
        run(b.build(), max_events=50)


# ------------------------------------------------------------------------------------------------ determinism
def test_two_runs_give_identical_counters():
    program = warm_program()
    a, b = run(program, record_events=10_000), run(program, record_events=10_000)
    assert a.cycles == b.cycles
    np.testing.assert_array_equal(a.unit_counters, b.unit_counters)
    np.testing.assert_array_equal(a.channel_counters, b.channel_counters)
    np.testing.assert_array_equal(a.events_recorded, b.events_recorded)
    assert (a.bytes_read, a.bytes_written, a.events) == (b.bytes_read, b.bytes_written, b.events)


def test_counters_split_the_clock_into_busy_and_blocked_time():
    """S2: the map's clock = busy (4 x 128) + blocked on input (waiting for tiles)."""
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,))
    m = b.map(ins=[x], out=y, fn="exp", compute_bw=1024)
    b.sink(inp=y)
    r = run(b.build())
    fires, busy, b_in, b_out, clock = r.unit_counters[m]
    assert (fires, busy, b_out) == (4, 4 * 128, 0)
    assert busy + b_in + b_out == clock == 713
    assert r.channel_counters[x].tolist() == [4, 1]


# ------------------------------------------------------------------------------------------------ stop levels
def test_flatten_and_promote_stop_rules_keep_element_count():
    b = builder(channel_depth=None)
    x, f, p, y = (b.add_channel() for _ in range(4))
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(2, 3, 4))
    b.flatten(inp=x, out=f, min_rank=0, max_rank=1)
    b.promote(inp=f, out=p, rank=1)
    b.accum(inp=p, out=y, fn="add", init_rows=1, init_cols=32, init_elem_bytes=2, rank=2)
    s = b.sink(inp=y)
    r = run(b.build())
    # flatten (2,3,4) -> (2,12); promote at rank 1 -> (2,1,12); an accum over rank 2 emits one per outer index
    assert r.unit_counters[s, abi.CNT_FIRES] == 2


def test_reshape_pads_a_partial_chunk_and_filtering_row_streamify_drops_the_pad():
    b = builder(channel_depth=None)
    x, r_, packed, rows = (b.add_channel() for _ in range(4))
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(5,))  # 5 rows, stop 1 on the last
    b.reshape(inp=x, out=r_, chunk=4, rank=0, pad_rows=1, pad_cols=32, pad_elem_bytes=2)
    b.accum(inp=r_, out=packed, fn="retile_row", init_rows=0, init_cols=32, init_elem_bytes=2, rank=1,
            compute_bw=0)
    b.row_streamify(inp=packed, out=rows, split_rows=True, filter_padding=True)
    s = b.sink(inp=rows)
    r = run(b.build())
    # two packed tiles of 4 rows (the second holds 1 real row and 3 pads) -> 5 real rows out
    assert r.unit_counters[s, abi.CNT_FIRES] == 5


def test_eager_merge_rejects_a_stop_above_its_rank():
    b = builder()
    x, d, s = (b.add_channel() for _ in range(3))
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(2, 2))
    b.eager_merge(ins=[x], data_out=d, sel_out=s, rank=1, name="merge")
    b.sink(inp=d)
    b.sink(inp=s)
    with pytest.raises(SimulationError, match="merge"):
        run(b.build())


def test_selectors_over_2048_targets_route_through_the_csr():
    n = 2048
    b = builder(channel_depth=None)
    sel, x = b.add_channel(), b.add_channel()
    outs = [b.add_channel() for _ in range(n)]
    b.select_gen(out=sel, targets_ptr=[0, n], targets_idx=list(range(n)), n_targets=n)
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(1,))
    b.partition(data=x, sel=sel, outs=outs, rank=0, switch_cycles=[1] * n)
    sinks = [b.sink(inp=o) for o in outs]
    r = run(b.build())
    assert r.unit_counters[sinks, abi.CNT_FIRES].sum() == n


# ------------------------------------------------------------------------------------------------ builder
def test_builder_rejects_a_channel_without_consumer():
    b = builder()
    x = b.add_channel(name="dangling")
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(1,), name="ld")
    with pytest.raises(LoweringError, match="'dangling' has no consumer.*'ld'"):
        b.build()


def test_builder_rejects_a_buffer_fed_to_a_map():
    b = builder()
    x, buf, y = b.add_channel(), b.add_channel(), b.add_channel()
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(2,))
    b.bufferize(inp=x, out=buf, rank=1)
    b.map(ins=[buf], out=y, fn="exp", name="bad_map")
    b.sink(inp=y)
    with pytest.raises(LoweringError, match="bad_map.*buffer"):
        b.build()


def test_builder_rejects_zero_compute_bw_for_flop_functions():
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    with pytest.raises(LoweringError, match="mm.*compute_bw > 0"):
        b.map(ins=[x, x], out=y, fn="matmul", compute_bw=0, name="mm")


def test_builder_rejects_two_consumers():
    b = builder()
    x, y, z = b.add_channel(name="x"), b.add_channel(), b.add_channel()
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(1,))
    b.map(ins=[x], out=y, fn="exp", name="a")
    b.map(ins=[x], out=z, fn="exp", name="b")
    with pytest.raises(LoweringError, match="'x' has two consumers"):
        b.build()


# ------------------------------------------------------------------------------------------------ hardware
def test_hardware_presets_and_overrides():
    ev = Hardware.preset("step-eval")
    hdl = Hardware.preset("step-hdl")
    assert ev.hbm_peak_bytes_per_cycle == 1024 and hdl.hbm_peak_bytes_per_cycle == 256
    assert (ev.pmu_bw, ev.channel_depth, hdl.pmu_bw, hdl.channel_depth) == (64, 2, 256, 1)
    assert Hardware.preset("step-eval", channel_depth=None).default_channel_capacity == 1024
    with pytest.raises(ConfigError, match="'pmu_bandwidth'"):
        Hardware.preset("step-eval", pmu_bandwidth=3)
    with pytest.raises(ConfigError, match="unknown hardware preset"):
        Hardware.preset("nope")


def test_hardware_from_toml_names_unknown_keys_and_the_file(tmp_path):
    good = tmp_path / "hw.toml"
    good.write_text('[hardware]\npreset = "step-hdl"\npmu_bw = 512\n')
    assert Hardware.from_toml(good) == Hardware.preset("step-hdl", pmu_bw=512)
    bad = tmp_path / "bad.toml"
    bad.write_text("hbm_chanels = 4\n")
    with pytest.raises(ConfigError, match=r"bad\.toml.*'hbm_chanels'"):
        Hardware.from_toml(bad)


# ------------------------------------------------------------------------------------------------ packaging
def test_importing_stepsim_kernels_does_not_compile():
    code = ("import sys, stepsim, stepsim.kernels, stepsim.kernels.program; "
            "print('stepsim.kernels.engine' in sys.modules, 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_kernels_do_not_import_graph_sympy_or_pyarrow():
    code = ("import sys; from stepsim.kernels import run; from stepsim.kernels.warm import warm_program; "
            "import stepsim.kernels.engine; "
            "print(sorted(m for m in ('sympy', 'pyarrow', 'stepsim.graph') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.slow
def test_engine_runs_as_pure_python_under_numba_disable_jit():
    code = ("from stepsim.kernels import run; from stepsim.kernels.warm import warm_program; "
            "from stepsim.kernels.jit import JIT_DISABLED; r = run(warm_program()); print(JIT_DISABLED, r.cycles)")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    jit_cycles = run(warm_program()).cycles
    assert out.stdout.split() == ["True", str(jit_cycles)]


def test_cli_cache_warm_reports_the_time(capsys):
    from stepsim.cli import main

    assert main(["cache", "warm"]) == 0
    assert "engine kernels ready in" in capsys.readouterr().out
