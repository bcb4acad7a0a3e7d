"""Batch sizes the shared traces do not have, on synthetic trace folders laid out like ../shared/traces.

* KV windows: B=80 (the paper's own windows, STEP_SEMANTICS §5.5) and B=20 (no paper windows: thirds by stdev)
  in one dynamic-parallelization run; a batch that is not a multiple of the 4 regions fails before simulating.
* Routing: B=1024 (the spec's tile list 16 ... 1024, §5.3; Qwen's FIFOs of 1024) at a reduced layer size
  (D=64, F=128) so every tile of the list runs in seconds.

Expected values come from the spec's closed forms (traffic, on-chip bytes, FLOPs, tiles), from the file
names (variance classes, row order) and from independent builds and simulations (cycles).
"""

import json
import math

import numpy as np
import pytest
from repro_traces import synthetic_routing, write_kv_window, write_routing

from stepsim.base.errors import ConfigError
from stepsim.models.presets import MoEModel
from stepsim.reproduce import TracesLayoutError, reproduce
from stepsim.reproduce.dynamic_tiling import plan as tiling_plan
from stepsim.simulation.simulate import simulate
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.moe.build import build_moe

# --- KV windows: B=80 (paper windows) and B=20 (thirds by stdev) --------------------------------------------
#: paper B=80 windows written (start, end, label): two of the three high ones, one med, one low (§5.5)
B80 = {"high": [(981, 1060, 1413), (815, 894, 1310)], "med": [(4687, 4766, 987)], "low": [(2025, 2104, 529)]}
#: B=20 windows (start, spread of the contents, label in the name); the 0900 label is wrong on purpose (the
#: contents spread 50): classes follow the contents, highest first: 400 and 250 high, 120 med, 50 low
B20 = [(1, 400, 400), (101, 50, 900), (201, 250, 250), (301, 120, 120)]
B20_CLASSES = [(1, "high"), (201, "high"), (301, "med"), (101, "low")]
#: STEP_SEMANTICS §5.5: the KV-cache capacity the B=80 experiments allocate
MAX_N_B80 = 6528


def _kv(rng, batch, base, spread):
    return np.clip(np.round(base + spread * rng.standard_normal(batch)), 0, 5000).astype(np.int64)


@pytest.fixture(scope="module")
def kv_traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    rng = np.random.default_rng(80)
    for variance, windows in B80.items():
        for start, end, label in windows:
            write_kv_window(root, start, end, _kv(rng, 80, 1200, label), label=label)
    # ignored: a B=80 window the paper does not list, a paper range from another trace, a 79-request name
    write_kv_window(root, 1, 80, _kv(rng, 80, 1200, 700), label=700)
    write_kv_window(root, 981, 1060, _kv(rng, 80, 1200, 1413), label=1413, trace="code")
    np.save(root / "kv_lengths" / "b80" / "conv_stdev0100_0001_0079.npy", _kv(rng, 79, 1200, 100))
    for start, spread, label in B20:
        write_kv_window(root, start, start + 19, _kv(rng, 20, 900, spread), label=label)
    return root


@pytest.fixture(scope="module")
def kv_result(kv_traces, tmp_path_factory):
    return reproduce("dynamic-parallelization", kv_traces, tmp_path_factory.mktemp("out"))[0]


def _tiles(kv):
    """§5.2: KV tiles of 32 tokens per request, the new token's slot included."""
    return -(-(np.asarray(kv) + 1) // 32)


def test_rows_follow_batch_then_class_with_paper_windows_for_b80_and_content_thirds_for_b20(kv_result):
    rows = kv_result.table.to_pylist()
    expected = [(20, v, s, s + 19) for s, v in B20_CLASSES]
    expected += [(80, v, s, e) for v, ws in B80.items() for s, e, _ in ws]
    assert [(r["batch"], r["variance"], r["start"], r["end"]) for r in rows] == expected
    labels = {s: lbl for s, _, lbl in B20} | {s: lbl for ws in B80.values() for s, _, lbl in ws}
    assert [r["trace"] for r in rows] == [f"b{r['batch']}/conv_stdev{labels[r['start']]:04d}_{r['start']:04d}_"
                                          f"{r['end']:04d}.npy" for r in rows]
    assert kv_result.simulations == 3 * 8


def test_window_statistics_capacity_regions_and_traffic_follow_the_spec(kv_result, kv_traces):
    for r in kv_result.table.to_pylist():
        kv = np.load(kv_traces / "kv_lengths" / r["trace"])
        tiles = _tiles(kv)
        assert r["stdev"] == float(np.std(kv.astype(np.float64), ddof=1))
        assert (r["kv_tiles"], r["max_kv_tiles"]) == (int(tiles.sum()), int(tiles.max()))
        # B=80: the spec's capacity and 4 coarse regions (region 0 holds two blocks of 16); B=20: the
        # smallest capacity holding every request, and 2 coarse regions (requests 0-15 and 16-19)
        if r["batch"] == 80:
            assert (r["max_n"], r["coarse_regions"]) == (MAX_N_B80, 4)
        else:
            assert (r["max_n"], r["coarse_regions"]) == (int(tiles.max()) * 32, 2)
        # §8.5: 8192 B per K+V tile read; per request 9216 B of write-backs and output, 1280 B of q/k/v loads
        assert r["off_chip_bytes"] == 8192 * r["kv_tiles"] + (9216 + 1280) * r["batch"]


def test_cycles_match_independent_simulations_and_the_headline_recomputes(kv_result, kv_traces):
    rows = kv_result.table.to_pylist()
    for r in rows:
        kv = np.load(kv_traces / "kv_lengths" / r["trace"])
        for strategy in ("coarse", "interleave", "dynamic"):
            workload = build_attention(kv, strategy)
            assert workload.params["max_n"] == r["max_n"]
            assert r[f"{strategy}_cycles"] == simulate(workload).cycles
        best = min(("coarse", "interleave"), key=lambda s: r[f"{s}_cycles"])
        assert (r["best_static"], r["speedup_vs_best_static"]) == (best, r[f"{best}_cycles"] / r["dynamic_cycles"])
    speedups = [r["speedup_vs_best_static"] for r in rows]
    assert kv_result.headline == {"dynamic_parallelization_speedup_geomean": pytest.approx(
        math.prod(speedups) ** (1 / len(speedups)), rel=1e-12)}
    b20, b80 = kv_result.details["batches"]
    assert (b20["batch"], b20["windows"], b80["batch"], b80["windows"]) == (20, 4, 80, 4)
    high80 = [r for r in rows if r["batch"] == 80 and r["variance"] == "high"]
    assert b80["classes"]["high"]["coarse"] == pytest.approx(
        math.sqrt(math.prod(r["coarse_cycles"] / r["dynamic_cycles"] for r in high80)), rel=1e-12)
    assert list(b20["classes"]) == ["high", "med", "low"]


def test_a_batch_not_divisible_by_the_regions_fails_before_simulating(tmp_path):
    rng = np.random.default_rng(18)
    for i, spread in enumerate((50, 300, 900)):
        write_kv_window(tmp_path, 100 * i + 1, 100 * i + 18, _kv(rng, 18, 1000, spread))
    with pytest.raises(TracesLayoutError, match=rf"{tmp_path / 'kv_lengths' / 'b18'}: batch 18 is not a multiple "
                                                r"of 4: static interleave deals the requests round-robin"):
        reproduce("dynamic-parallelization", tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- routing: B=1024 --------------------------------------------------------------------------------------
#: §5.3: the static tile sweep of B=1024
TILES_B1024 = (16, 32, 64, 128, 256, 512, 1024)
#: the reduced layer: D and F (F / tile_F = 2 weight tiles of the spec's tile_F = 64)
D, F, TILE_F = 64, 128, 64
REDUCED = {"hidden": D, "intermediate": F}
MODELS = {"mixtral-8x7b": ("mixtral", 8, 2), "qwen3-30b-a3b": ("qwen", 128, 8)}


@pytest.fixture(scope="module")
def routing_traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    rng = np.random.default_rng(1024)
    for prefix, experts, top_k in MODELS.values():
        write_routing(root, f"{prefix}_b1024", synthetic_routing(rng, 1024, experts, top_k), "022_016.npz")
    write_routing(root, "mixtral_b32", synthetic_routing(rng, 32, 8, 2))
    return root


def _closed_form(routing, experts, top_k, tile_n):
    """STEP_SEMANTICS §8.3 (mock_bf16) and §5.3 FLOPs: (off-chip, on-chip raw, on-chip active, FLOPs)."""
    counts = np.bincount(routing.ravel(), minlength=experts)
    batch = len(routing)
    inputs = batch * D * 2 + batch * top_k * 2 + batch * D * 4
    weights = 3 * D * F * 2
    if tile_n is None:  # dynamic tiling, round_N = 1
        off = inputs + weights * int((counts > 0).sum())
        unit = 3 * D * TILE_F * 2
        on = D * 2 + 2 + int((3 * counts * D * 4).sum()) + experts * unit + 2 * D * 4
        padded = counts
    else:
        tiles = -(-counts // tile_n)
        off = inputs + weights * int(tiles.sum())
        unit = 3 * tile_n * D * 4 + 3 * D * TILE_F * 2
        on = D * 2 + 2 + experts * unit + 2 * D * 4
        padded = tiles * tile_n
    flops = int((2 * padded * D * F * 3 + padded * F + 8 * padded * D * F).sum())
    return off, on, on - int((counts == 0).sum()) * unit, flops


def test_b1024_plans_the_spec_tile_list_and_unbounded_qwen_fifos_and_powers_of_two_elsewhere(routing_traces):
    points = tiling_plan(routing_traces)
    got = [(p.labels["model"], p.labels["batch"], p.config["tiling"], p.config.get("tile_n"),
            p.config.get("channel_depth")) for p in points]
    assert got == ([("mixtral-8x7b", 32, "static", t, None) for t in (8, 16, 32)]
                   + [("mixtral-8x7b", 32, "dynamic", None, None)]
                   + [("mixtral-8x7b", 1024, "static", t, None) for t in TILES_B1024]
                   + [("mixtral-8x7b", 1024, "dynamic", None, None)]
                   + [("qwen3-30b-a3b", 1024, "static", t, 1024) for t in TILES_B1024]
                   + [("qwen3-30b-a3b", 1024, "dynamic", None, 1024)])
    assert {p.config["model"] for p in points} == {"mixtral-8x7b", "qwen3-30b-a3b"}


def test_model_dims_errors_name_the_key(routing_traces):
    with pytest.raises(ConfigError, match="model_dims: unknown model.s. mixtral; expected mixtral-8x7b, qwen3-30b-a3b"):
        tiling_plan(routing_traces, model_dims={"mixtral": REDUCED})
    with pytest.raises(ConfigError, match=r"model_dims\['qwen3-30b-a3b'\]: unknown key\(s\) dim"):
        tiling_plan(routing_traces, model_dims={"qwen3-30b-a3b": {"dim": 64}})


@pytest.fixture(scope="module")
def mixtral_b1024(routing_traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    options = {"dynamic-tiling": {"models": ("mixtral-8x7b",), "model_dims": {"mixtral-8x7b": REDUCED},
                                  "tiles": {32: (32,)}}}
    return reproduce("dynamic-tiling", routing_traces, out, options=options)[0], out


def test_b1024_runs_every_spec_tile_with_closed_form_traffic_memory_and_flops(mixtral_b1024, routing_traces):
    result, _ = mixtral_b1024
    rows = [r for r in result.table.to_pylist() if r["batch"] == 1024]
    assert [(r["model"], r["trace"], r["tiling"], r["tile_n"]) for r in rows] == (
        [("mixtral-8x7b", "mixtral_b1024/022_016.npz", "static", t) for t in TILES_B1024]
        + [("mixtral-8x7b", "mixtral_b1024/022_016.npz", "dynamic", None)])
    assert [(r["tile_f"], r["channel_depth"], r["compute_bw"]) for r in rows] == [(64, 2, 4096)] * 7 + [(64, 2, 6400)]
    routing = np.load(routing_traces / "expert_routing" / "mixtral_b1024" / "022_016.npz")["data"]
    model = MoEModel("reduced-mixtral", hidden=D, intermediate=F, experts=8, top_k=2)
    for r in rows:
        assert (r["off_chip_bytes"], r["on_chip_bytes"], r["on_chip_bytes_active"], r["flops"]) == _closed_form(
            routing, 8, 2, r["tile_n"])
        expected = r["on_chip_bytes"] if r["tiling"] == "static" else r["on_chip_bytes_active"]
        assert r["on_chip_bytes_plotted"] == expected
        workload = build_moe(model, routing, tiling=r["tiling"], tile_n=r["tile_n"])
        assert r["cycles"] == simulate(workload).cycles


def test_b1024_headline_applies_the_rule_per_batch_and_skips_the_v1_pairing(mixtral_b1024):
    result, out = mixtral_b1024
    groups = []
    for batch in (32, 1024):
        rows = [r for r in result.table.to_pylist() if r["batch"] == batch]
        static = [r for r in rows if r["tiling"] == "static"]
        [dyn] = [r for r in rows if r["tiling"] == "dynamic"]
        fast = [r for r in static if r["cycles"] <= 1.05 * dyn["cycles"]]
        mem_ref = (min(fast, key=lambda r: r["on_chip_bytes_plotted"]) if fast
                   else min(static, key=lambda r: r["cycles"]))
        small = [r for r in static if r["on_chip_bytes_plotted"] <= 1.05 * dyn["on_chip_bytes_plotted"]]
        speed_ref = (min(small, key=lambda r: r["cycles"]) if small
                     else min(static, key=lambda r: r["on_chip_bytes_plotted"]))
        groups.append((batch, mem_ref["tile_n"], mem_ref["on_chip_bytes_plotted"] / dyn["on_chip_bytes_plotted"],
                       speed_ref["tile_n"], speed_ref["cycles"] / dyn["cycles"]))
    assert [(g["batch"], g["memory_reference_tile"], g["onchip_reduction"], g["speed_reference_tile"], g["speedup"])
            for g in result.details["groups"]] == groups
    assert result.headline == {
        "dynamic_tiling_onchip_reduction_geomean": pytest.approx(math.sqrt(groups[0][2] * groups[1][2]), rel=1e-12),
        "dynamic_tiling_speedup_geomean": pytest.approx(math.sqrt(groups[0][4] * groups[1][4]), rel=1e-12)}
    assert result.details["v1_pairs_b64"] is None  # arXiv v1's pairing is defined for B=64 only
    saved = json.loads((out / "dynamic_tiling_headline.json").read_text())
    assert saved["headline"] == result.headline
    assert (out / "dynamic_tiling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_qwen_b1024_simulates_with_fifos_of_1024(routing_traces, tmp_path):
    options = {"dynamic-tiling": {"models": ("qwen3-30b-a3b",), "model_dims": {"qwen3-30b-a3b": REDUCED},
                                  "tiles": {1024: (1024,)}}}
    [result] = reproduce("dynamic-tiling", routing_traces, tmp_path, options=options)
    rows = result.table.to_pylist()
    assert [(r["tiling"], r["tile_n"], r["channel_depth"]) for r in rows] == [("static", 1024, 1024),
                                                                            ("dynamic", None, 1024)]
    routing = np.load(routing_traces / "expert_routing" / "qwen_b1024" / "022_016.npz")["data"]
    model = MoEModel("reduced-qwen", hidden=D, intermediate=F, experts=128, top_k=8)
    for r in rows:
        assert (r["off_chip_bytes"], r["on_chip_bytes"], r["on_chip_bytes_active"], r["flops"]) == _closed_form(
            routing, 128, 8, r["tile_n"])
        workload = build_moe(model, routing, tiling=r["tiling"], tile_n=r["tile_n"], channel_depth=1024)
        assert r["cycles"] == simulate(workload).cycles
    # the depth reaches the engine: the experiments' default FIFOs of 2 give other cycles here
    assert rows[1]["cycles"] != simulate(build_moe(model, routing, tiling="dynamic", channel_depth=2)).cycles
