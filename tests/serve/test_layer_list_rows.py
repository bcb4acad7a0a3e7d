"""summary.json's ``layers`` of a heterogeneous model on mapped layers (stepsim/serve/layer_use.py ``provider_rows``):
each layer group's buckets and schedules, its rows naming the group, and ``stepsim report``'s text listing them
under a line a group. Until 2026-11-28 such a run wrote no ``layers`` (its provider, a LayerListLatency, has none
of its own) and the report said it ran on the paper's schedules."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepsim.insight.serve_layers import format_serve_report, serve_report
from stepsim.models.presets import resolve_model
from stepsim.serve.api import engine_provider, resolve_serving_hardware
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_list import exact_layer_list, group_gate, group_seed
from stepsim.serve.layer_use import provider_rows
from stepsim.serve.output import write_outputs

OSS = str(Path(__file__).resolve().parent / "data" / "gpt-oss-20b-2layers.json")


def test_a_layer_list_runs_rows_are_its_groups_rows_each_naming_its_group(tmp_path):
    """The rows as serve's summary.json holds them (written by the run's writer) and ``stepsim report`` reads them."""
    model = resolve_model(OSS)
    hw = resolve_serving_hardware("sn40l")
    latency = exact_layer_list(model, lambda sub, g: engine_provider(
        sub, OSS, hw, None, seed=group_seed(0, g), max_model_len=4096, vocab=201088, jobs=None, schedule="auto",
        gate=group_gate(model, sub)))
    try:
        for batch in (IterationBatch([64, 300], [1, 1], 0, 2), IterationBatch([200, 300], [1, 1], 0, 2)):
            latency(batch)
        rows = provider_rows(latency)
        assert rows == [{"group": {"layers": list(layers), "kind": kind.describe()}, **row}
                        for kind, layers, group in latency.groups for row in group.inner.layer_use.rows()]
    finally:
        latency.close()
    assert [(r["group"]["layers"], r["group"]["kind"], r["kind"], r["bucket"], r["steps"], r["cycles"])
            for r in rows] == [([0], "sliding 128 + sinks + moe", "decode", 16, 2, 4195),
                               ([0], "sliding 128 + sinks + moe", "ffn", 2, 2, 232697),
                               ([1], "full + sinks + moe", "decode", 16, 2, 4195),
                               ([1], "full + sinks + moe", "ffn", 2, 2, 232697)]
    summary = {"model": "gpt-oss-20b-2layers", "hardware": {"name": "sn40l"}, "layers": rows}
    write_outputs(tmp_path, pa.table({"request_id": [0]}), pa.table({"step": [0]}), summary, {})
    report = serve_report(tmp_path)
    assert report["layers"] == rows
    text = format_serve_report(report).splitlines()
    assert [line.strip() for line in text[3:]] == [
        "layers 0 (sliding 128 + sinks + moe):",
        "decode       16      2       4,195   66.9%     1.3%        1040/147         regions=16",
        "ffn           2      2     232,697   93.6%     0.5%        1040/328         tile_n=2 tile_f=32 lanes=18 regions=4",
        "layers 1 (full + sinks + moe):",
        "decode       16      2       4,195   66.9%     1.3%        1040/147         regions=16",
        "ffn           2      2     232,697   93.6%     0.5%        1040/328         tile_n=2 tile_f=32 lanes=18 regions=4"]


def test_a_runs_rows_without_mapped_layers_are_none():
    """A provider without a ``layer_use`` (the paper's schedules), or a layer list none of whose groups has one."""
    class Plain:
        pass

    class Group:
        inner = Plain()

    class Listed:
        groups = [(None, (0,), Group())]

    assert provider_rows(Plain()) is None and provider_rows(Listed()) is None


def test_a_groups_line_names_its_layers_as_a_range_or_a_list():
    """DeepSeek-V3's dense and MoE groups are ranges; gpt-oss's sliding and full layers alternate."""
    rows = [{"group": {"layers": layers, "kind": "k"}, "kind": "ffn", "bucket": 1, "steps": 1, "cycles": 1,
             "hbm_utilisation": 0.0, "compute_utilisation": 0.0, "compute_units": 1, "memory_units": 1, "knobs": {}}
            for layers in ([0, 1, 2], list(range(3, 61)), [0, 2, 4], [7])]
    text = format_serve_report({"model": "m", "hardware": "sn40l", "utilisation": None, "layers": rows})
    assert [line.strip() for line in text.splitlines() if line.strip().startswith("layers ")] == [
        "layers 0-2 (k):", "layers 3-60 (k):", "layers 0, 2, 4 (k):", "layers 7 (k):"]
