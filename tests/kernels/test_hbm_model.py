"""The batched HBM (one engine event per tile) equals a direct per-request, tick-by-tick model.

The reference below follows STEP_TIMING §4.2-§4.3 literally: per-op address FIFOs of ParAddrs chunks
(stamped ``max(t0 + k, t0 + 1)``), at most one chunk per op per tick (readers, then writers, in registration
order), triangular channel offsets, channel contexts with FIFO request queues (``s = max(clock, arrival)``,
respond at ``s + start_up + latency``, ``clock = s + II``), at most one response forwarded per channel per tick
(arrival at the op one cycle later), and a tile completing when all its responses arrived.
"""

from __future__ import annotations

from collections import deque

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from kernel_helpers import final_clock

from stepsim.base.hardware import Hardware
from stepsim.kernels import run
from stepsim.kernels.program import ProgramBuilder


def reference_hbm(ops, hw: Hardware):
    """Simulate memory ops tick by tick.

    ``ops``: list of dicts in builder order with ``kind`` ("load"/"store"), ``n_req`` per tile, ``par``,
    ``tiles`` and, for stores, ``source`` (index of the load feeding it; its tile i arrives at completion + 1).
    Loads never block on their outputs (the tests use deep channels). Returns each op's final clock.
    """
    C = hw.hbm_channels
    order = [i for i, o in enumerate(ops) if o["kind"] == "load"] + [i for i, o in enumerate(ops)
                                                                      if o["kind"] == "store"]
    state = [{"phase": "idle", "tile": 0, "fifo": deque(), "pending": 0, "comp": 0, "clock": 0,
              "completions": []} for _ in ops]
    ch_clock = [0] * C
    ch_resp = [deque() for _ in range(C)]  # (ready, op) in FIFO order
    off = 0

    def try_start(i):
        s, o = state[i], ops[i]
        if s["tile"] == o["tiles"]:
            s["phase"] = "done"
            return
        t0 = s["clock"]
        if o["kind"] == "store":
            src = state[o["source"]]["completions"]
            if len(src) <= s["tile"]:
                return  # the input tile has not arrived yet
            t0 = max(t0, src[s["tile"]] + 1)  # PEEK: clock = max(clock, stamp)
        n, P = o["n_req"], o["par"]
        for k in range(max(1, -(-n // P))):
            s["fifo"].append((max(t0 + k, t0 + 1), min(P, n - k * P)))
        s.update(phase="flight", pending=n, comp=t0, clock=t0)

    for i in range(len(ops)):
        try_start(i)
    T = 0
    while any(s["phase"] != "done" for s in state):
        for c in range(C):  # responses first: at most one per channel per tick, arriving at T + 1
            if ch_resp[c] and ch_resp[c][0][0] <= T:
                _, i = ch_resp[c].popleft()
                state[i]["pending"] -= 1
                state[i]["comp"] = max(state[i]["comp"], T + 1)
        batch = []  # at most one ParAddrs per op per tick, readers then writers
        for i in order:
            fifo = state[i]["fifo"]
            if fifo and fifo[0][0] <= T:
                batch.extend([i] * fifo.popleft()[1])
        for bi, i in enumerate(batch):  # triangular offsets; channel contexts in FIFO order
            off = (off + bi) % C
            start = max(ch_clock[off], T + 1)
            ch_clock[off] = start + hw.hbm_init_interval
            ch_resp[off].append((start + hw.hbm_start_up + hw.hbm_latency, i))
        off = (off + len(batch)) % C
        for i, s in enumerate(state):
            if s["phase"] == "flight" and not s["fifo"] and s["pending"] == 0:
                s["clock"] = s["comp"]
                s["completions"].append(s["comp"])
                s["tile"] += 1
                s["phase"] = "idle"
        for i, s in enumerate(state):
            if s["phase"] == "idle":
                try_start(i)
        T += 1
        assert T < 10 ** 6
    return [s["clock"] for s in state]


def _memory_program(ops, hw):
    """Loads in builder order (each feeding a sink or a store), then the stores; returns the program, the
    reference model's ops and the memory units in reference order."""
    b = ProgramBuilder(hw)
    ref_ops, load_units, store_inputs, store_units = [], [], [], []
    for o in ops:
        x = b.add_channel()
        load_units.append(b.offchip_load(out=x, tile_rows=o["rows"], tile_cols=o["row_bytes"] // 2, elem_bytes=2,
                                         view_shape=(o["tiles"],), par_dispatch=o["par"]))
        n_req = o["rows"] * (o["row_bytes"] // 64)
        ref_ops.append({"kind": "load", "n_req": n_req, "par": o["par"], "tiles": o["tiles"]})
        if o["store"]:
            store_inputs.append((len(ref_ops) - 1, x, n_req, o))
        else:
            b.sink(inp=x)
    for src, x, n_req, o in store_inputs:
        store_units.append(b.offchip_store(inp=x, par_dispatch=o["par"]))
        ref_ops.append({"kind": "store", "n_req": n_req, "par": o["par"], "tiles": o["tiles"], "source": src})
    return b.build(), ref_ops, load_units + store_units


op_strategy = st.fixed_dictionaries({
    "rows": st.integers(1, 6),
    "row_bytes": st.sampled_from([64, 128, 192, 256, 512]),
    "par": st.integers(1, 8),
    "tiles": st.integers(1, 4),
    "store": st.booleans(),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op_strategy, min_size=1, max_size=5), channels=st.sampled_from([2, 3, 4, 8, 32]),
       ii=st.integers(1, 3), start_up=st.integers(0, 14), latency=st.integers(0, 3))
def test_batched_hbm_equals_per_request_tick_model(ops, channels, ii, start_up, latency):
    hw = Hardware.preset("step-eval", hbm_channels=channels, hbm_init_interval=ii, hbm_start_up=start_up,
                         hbm_latency=latency, channel_depth=None)
    program, ref_ops, units = _memory_program(ops, hw)
    result = run(program)
    assert [final_clock(result, u) for u in units] == reference_hbm(ref_ops, hw)


def test_reference_model_reproduces_s12():
    hw = Hardware.preset("step-hdl")
    assert reference_hbm([{"kind": "load", "n_req": 16, "par": 4, "tiles": 1}], hw) == [23]


# ------------------------------------------------------------------------------------------- closed form
# Tiles long enough for the HBM's steady-state periods (kernels.hbm._try_skip): several readers and writers,
# par_dispatch 1 and 4, 8 and 32 channels, against the per-request tick model above and against the same
# engine serving every tick one by one.
long_op_strategy = st.fixed_dictionaries({
    "rows": st.integers(1, 48),
    "row_bytes": st.sampled_from([64, 128, 256, 512, 1024]),
    "par": st.sampled_from([1, 4]),
    "tiles": st.integers(1, 3),
    "store": st.booleans(),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(long_op_strategy, min_size=1, max_size=6), channels=st.sampled_from([8, 32]),
       ii=st.integers(1, 3))
def test_closed_form_hbm_equals_per_request_model(ops, channels, ii):
    hw = Hardware.preset("step-eval", hbm_channels=channels, hbm_init_interval=ii, channel_depth=None)
    _assert_closed_form_exact(*_memory_program(ops, hw), hw)


def _assert_closed_form_exact(program, ref_ops, units, hw):
    """The default engine against the per-request tick model and against the engine serving every tick."""
    fast = run(program)
    per_tick = run(program, hbm_closed_form=False)
    assert per_tick.hbm_closed_form_ticks == per_tick.hbm_uneven_closed_form_ticks == 0
    assert [final_clock(fast, u) for u in units] == reference_hbm(ref_ops, hw)
    for field in ("cycles", "events", "fires", "bytes_read", "bytes_written", "hbm_requests"):
        assert getattr(fast, field) == getattr(per_tick, field), field
    assert (fast.unit_counters == per_tick.unit_counters).all()
    assert (fast.channel_counters == per_tick.channel_counters).all()
    return fast


# Few channels and par_dispatch 1-2 make the channels of a period receive different request counts, so they move
# by different amounts (the uneven case of _try_skip: K - 1 periods skipped, the K-th served tick by tick).
uneven_op_strategy = st.fixed_dictionaries({
    "rows": st.integers(8, 48),
    "row_bytes": st.sampled_from([256, 512, 1024]),
    "par": st.sampled_from([1, 2]),
    "tiles": st.integers(1, 3),
    "store": st.booleans(),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(uneven_op_strategy, min_size=2, max_size=5), channels=st.sampled_from([3, 5, 6, 8]),
       ii=st.integers(1, 4))
def test_uneven_closed_form_equals_per_request_model(ops, channels, ii):
    hw = Hardware.preset("step-eval", hbm_channels=channels, hbm_init_interval=ii, channel_depth=None)
    _assert_closed_form_exact(*_memory_program(ops, hw), hw)


def test_uneven_periods_are_served_in_closed_form():
    """Three loads with P=1 on 8 channels (II 3): 3 requests per tick, so the channel pattern repeats every
    L = 8 / gcd(6, 8) = 4 ticks and a period sends 2 requests to channels 1, 3, 5, 7 and 1 to the others. The
    single-request channels find the channel idle each period and move by exactly L; the others stay backlogged
    and move by 2 * II = 6. Every tick served in closed form is of this uneven kind (1116 of them), and every
    count equals the per-tick engine's."""
    hw = Hardware.preset("step-eval", hbm_channels=8, hbm_init_interval=3, channel_depth=None)
    ops = [{"rows": 48, "row_bytes": 1024, "par": 1, "tiles": 2, "store": False} for _ in range(3)]
    fast = _assert_closed_form_exact(*_memory_program(ops, hw), hw)
    assert (fast.cycles, fast.hbm_requests, fast.hbm_closed_form_ticks, fast.hbm_uneven_closed_form_ticks) == (
        2180, 4608, 1116, 1116)


def test_closed_form_serves_the_steady_state_of_one_long_tile():
    """STEP_TIMING §9 S1 (one 64x4096 bf16 tile: 8192 requests, P=1, 32 channels): 8212 cycles either way.

    Ticks t0+1 .. t0+8192 serve one request each; the channel pattern repeats every L = 32 ticks. The tick
    t0+1 starts the run, the first watched period (ticks t0+2 .. t0+33) still sees channels never used before,
    the second (t0+34 .. t0+65) repeats exactly (every channel moved by 32), so K = (8192 - 65 - 1) // 32 = 253
    periods = 8096 ticks are served in closed form and the last 31 ticks one by one."""
    b = ProgramBuilder(Hardware.preset("step-eval"))
    x = b.add_channel()
    b.offchip_load(out=x, tile_rows=64, tile_cols=4096, elem_bytes=2, view_shape=(1,))
    b.sink(inp=x)
    fast = run(b.build())
    assert (fast.cycles, fast.hbm_requests, fast.hbm_closed_form_ticks) == (8212, 8192, 8096)
    assert run(b.build(), hbm_closed_form=False).cycles == 8212


def test_closed_form_with_saturated_channels():
    """Eight loads with P=16 on 8 channels ask for 128 requests per tick against a capacity of 4 (II 2): the
    backlog grows by the same amount every period (the linear case of _try_skip) and results stay exact."""
    hw = Hardware.preset("step-eval", hbm_channels=8, channel_depth=None)
    ops = [{"rows": 64, "row_bytes": 1024, "par": 16, "tiles": 2, "store": False} for _ in range(8)]
    program, ref_ops, units = _memory_program(ops, hw)
    fast = run(program)
    assert fast.hbm_closed_form_ticks > 0
    assert [final_clock(fast, u) for u in units] == reference_hbm(ref_ops, hw)
    assert fast.cycles == run(program, hbm_closed_form=False).cycles
