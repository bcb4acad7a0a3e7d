"""summary.json ``layers`` on an expert-parallel system (stepsim/serve/layer_use.py): an FFN row is the MoE block
over the system's chips, each chip's experts mapped (stepsim/mapping/expert_parallel.py), checked against the
engine: its cycles are the mean of the representative routings' simulations, its bytes those the engine reads and
writes on the first, its units each chip's. Until 2026-11-27 the row was the one-chip schedule of the whole block."""

from __future__ import annotations

import dataclasses

import pytest

from stepsim.base.hardware import Hardware
from stepsim.base.system import System
from stepsim.graph.lower import lower
from stepsim.kernels.api import run as engine_run
from stepsim.mapping.expert_parallel import assign_chip_units, mapped_ep_workload
from stepsim.mapping.kinds.ffn import ffn_routing, ffn_samples
from stepsim.models.presets import resolve_model
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_use import LayerUse
from stepsim.serve.system import system_layer_spec

SN40L = Hardware.preset("sn40l")


def _rows(system_name: str) -> tuple[list[dict], object]:
    system = dataclasses.replace(System.preset(system_name), hardware=SN40L)
    spec = system_layer_spec(resolve_model("examples/small-moe.json"), system, 4096, "auto")
    use = LayerUse(spec)
    use.note(IterationBatch([20, 62, 100, 7], [40, 3, 1, 1], 0, 0))  # 45 tokens: bucket 64
    use.note(IterationBatch([5], [1], 0, 0))  # 1 token
    use.note(IterationBatch([5, 9], [1, 1], 0, 0))  # 2 tokens
    return use.rows(), spec


def _engine(workload):
    return engine_run(lower(workload.graph, SN40L, channel_depth=workload.channel_depth,
                            channel_depths=workload.channel_depths))


@pytest.mark.parametrize("system_name", ["ring-2", "ring-4"])
def test_an_ffn_row_is_the_expert_parallel_block_as_the_engine_runs_it(system_name):
    rows, spec = _rows(system_name)
    ffn = [r for r in rows if r["kind"] == "ffn"]
    assert [(r["bucket"], r["steps"], r["system"], r["chips"]) for r in ffn] == [
        (b, 1, system_name, spec.system.chips) for b in (1, 2, 64)]
    model, system = spec.ffn_model, spec.system
    for row in ffn:
        tokens = row["bucket"]
        layers = [mapped_ep_workload(model, ffn_routing(tokens, model, s), system, SN40L)
                  for s in range(ffn_samples(tokens))]
        assert all(knobs == row["knobs"] for _, knobs in layers)
        runs = [_engine(w) for w, _ in layers]
        assert row["cycles"] == round(sum(r.cycles for r in runs) / len(runs))
        first = runs[0]
        assert row["off_chip_bytes"] == first.bytes_read + first.bytes_written
        units = assign_chip_units(layers[0][0], SN40L)
        assert (row["chip_compute_units"], row["compute_units"]) == (list(units), max(units))
        assert row["compute_utilisation"] == row["flops"] / (row["cycles"] * system.chips * SN40L.peak_flops_per_cycle)
        assert row["hbm_utilisation"] == row["off_chip_bytes"] / (
            row["cycles"] * system.chips * SN40L.hbm_peak_bytes_per_cycle)
        assert row["memory_units"] == max(row["chip_memory_units"]) and len(row["chip_memory_units"]) == system.chips
    # the attention rows stay one chip's share of the heads, as each chip runs it
    assert [r["kind"] for r in rows if r["kind"] != "ffn"] == ["prefill", "decode", "decode"]
    assert all("system" not in r for r in rows if r["kind"] != "ffn")


def test_an_ffn_rows_cycles_without_the_stored_search_are_simulated_again(monkeypatch):
    """The stored search's cycles, or the same simulations when it was not stored (no mapping cache)."""
    import stepsim.mapping.mapper as mapper

    stored, _ = _rows("ring-2")
    monkeypatch.setattr(mapper, "_cache_folder", lambda cache: None)
    again, _ = _rows("ring-2")
    assert again == stored


def test_report_says_an_ffn_rows_units_are_the_busiest_chips():
    from stepsim.insight.serve_layers import format_serve_report

    rows, _ = _rows("ring-2")
    text = format_serve_report({"model": "small-moe", "hardware": "sn40l", "utilisation": None, "layers": rows})
    ffn = [line for line in text.splitlines() if line.startswith("  ffn")]
    one = rows[-3]  # the 1-token bucket
    assert ffn[0] == (f"  ffn           1      1 {one['cycles']:>11,} {100 * one['hbm_utilisation']:>6.1f}% "
                      f"{100 * one['compute_utilisation']:>7.1f}% {one['compute_units']:>11}/{one['memory_units']:<10}  "
                      + " ".join(f"{k}={v}" for k, v in one["knobs"].items())
                      + "  (2 chips of ring-2, units: the busiest chip's)")
    assert len(ffn) == 3 and all(line.endswith("(2 chips of ring-2, units: the busiest chip's)") for line in ffn)


def test_an_exact_run_on_a_system_lists_its_layers(tmp_path, shared_traces):
    """``--fidelity exact --schedule auto --system``: the summary lists the buckets its steps used, the FFN's as the
    block over the chips (until 2026-11-27 an exact run on a system listed none)."""
    import stepsim
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.output import read_outputs

    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    run = stepsim.serve("examples/small-moe.json", trace, fidelity="exact", system="ring-2", hardware="sn40l",
                        schedule="auto", limit_requests=3, drop_long=True, out=tmp_path / "out")
    rows = run.summary["layers"]
    _, iterations, stored = read_outputs(tmp_path / "out")
    assert stored["layers"] == rows
    tokens = iterations["tokens"].to_pylist()
    ffn = {r["bucket"]: r for r in rows if r["kind"] == "ffn"}
    assert {b: r["steps"] for b, r in ffn.items()} == {b: sum(bucket(t) == b for t in tokens) for b in
                                                     sorted({bucket(t) for t in tokens})}
    assert all((r["system"], r["chips"], len(r["chip_compute_units"])) == ("ring-2", 2, 2) for r in ffn.values())
    assert {r["kind"] for r in rows} == {"prefill", "decode", "ffn"}
