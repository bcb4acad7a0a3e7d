"""Per-layer utilisation of a mapped serving run (stepsim/serve/layer_use.py): summary.json ``layers`` lists each
layer kind and bucket the steps used with its schedule's cycles, HBM and compute utilisation and units, and
``stepsim report`` prints it for a serve folder.

The schedules are injected (as tests/serve/test_fast_mapped.py does): what is checked is which bucket each step's
pieces take and the arithmetic of the utilisation, not the mapper's search (tests/mapping)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_requests import requests_file

import stepsim
from stepsim.base.hardware import PRESETS
from stepsim.cli import main
from stepsim.mapping.schedule import Schedule
from stepsim.models.presets import resolve_model
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_use import step_buckets

SN40L = PRESETS["sn40l"]
#: a dense model of 2 KV heads (4 query heads), head_dim 32
TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000,
        "max_position_embeddings": 2048}


def _schedule_for(kind, size, dims, hardware, *, cache=True):
    """One schedule a kind, whatever the bucket: regions 1 (every piece builds at any size), cycles 1,000 + bucket,
    16,000 bytes and 638,000 FLOPs a cycle's worth at 1,000 cycles, units by kind."""
    from stepsim.mapping.mapper import bucket

    b = bucket(size)
    knobs = {"tile_n": 1, "tile_f": 32, "lanes": 1, "regions": 1} if kind == "ffn" else {"regions": 1}
    units = {"prefill": (40, 12), "decode": (30, 9), "ffn": (1000, 300)}[kind]
    return Schedule(kind, knobs, cycles=1000 + b, off_chip_bytes=800_000, flops=63_800_000,
                    compute_units=units[0], memory_units=units[1])


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    import stepsim.mapping
    import stepsim.serve.exact

    monkeypatch.setattr(stepsim.mapping, "schedule_for", _schedule_for)
    monkeypatch.setattr(stepsim.serve.exact, "_RUNNERS", {})
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def test_a_steps_pieces_take_their_buckets(tiny):
    model = resolve_model(str(tiny))
    # a 40-token chunk after 20 cached (position tiles 0 and 1) and a 3-token one after 62 (tile 1 and 2), two
    # decodes: prefill 2 heads x 4 query tiles -> 128 positions a head; decode 2 x 2 requests; ffn 45 tokens -> 64
    batch = IterationBatch([20, 62, 100, 7], [40, 3, 1, 1], 0, 0)
    assert step_buckets(batch, model) == [("prefill", 128), ("decode", 4), ("ffn", 64)]
    assert step_buckets(IterationBatch([5], [1], 0, 0), model) == [("decode", 2), ("ffn", 1)]


def test_the_summary_lists_each_layer_and_report_prints_it(tiny, tmp_path, capsys):
    trace = requests_file(tmp_path / "t.parquet", np.zeros(2), np.array([40, 70]), np.array([3, 3]))
    run = stepsim.serve(str(tiny), trace, fidelity="exact", schedule="auto", out=tmp_path / "out")
    # step 0: both prompts (40 + 70 tokens: 2 + 3 query tiles a head, 160 positions -> bucket 256; 110 tokens ->
    # 128); steps 1-2: two decodes (4 requests over the heads; 2 tokens)
    assert run.summary["iterations"] == 3
    rows = run.summary["layers"]
    assert [(r["kind"], r["bucket"], r["steps"], r["cycles"]) for r in rows] == [
        ("prefill", 256, 1, 1256), ("decode", 4, 2, 1004), ("ffn", 2, 2, 1002), ("ffn", 128, 1, 1128)]
    assert rows[0] == {"kind": "prefill", "bucket": 256, "steps": 1, "knobs": {"regions": 1}, "cycles": 1256,
                       "off_chip_bytes": 800_000, "flops": 63_800_000,
                       "hbm_utilisation": 800_000 / (1256 * 1600), "compute_utilisation": 63_800_000 / (1256 * 638_000),
                       "compute_units": 40, "memory_units": 12}
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out")]) == 0
    use = run.summary["utilisation"]
    assert capsys.readouterr().out.splitlines() == [
        f"serve run: {tiny} on sn40l",
        f"  HBM utilisation {100 * use['hbm']:.1f} % (median step {100 * use['hbm_p50']:.1f} %), compute "
        f"{100 * use['compute']:.1f} % (median step {100 * use['compute_p50']:.1f} %)",
        "  layer    bucket  steps      cycles     HBM  compute units (compute/memory)  knobs",
        "  prefill     256      1       1,256   39.8%     8.0%          40/12          regions=1",
        "  decode        4      2       1,004   49.8%    10.0%          30/9           regions=1",
        "  ffn           2      2       1,002   49.9%    10.0%        1000/300         tile_n=1 tile_f=32 lanes=1 regions=1",
        "  ffn         128      1       1,128   44.3%     8.9%        1000/300         tile_n=1 tile_f=32 lanes=1 regions=1",
    ]
    assert main(["report", str(tmp_path / "out"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep == {"run": "serve", "model": run.summary["model"], "hardware": "sn40l", "utilisation": use,
                   "layers": rows}


def test_a_paper_run_has_no_layers_and_report_says_so(tiny, tmp_path, capsys):
    trace = requests_file(tmp_path / "t.parquet", np.zeros(1), np.array([40]), np.array([2]))
    run = stepsim.serve(str(tiny), trace, fidelity="exact", schedule="paper", out=tmp_path / "out")
    assert "layers" not in run.summary
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  layers: on the paper's schedules (--schedule paper): no mapped schedule to report")


def test_a_serve_folder_with_a_damaged_summary_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "iterations.parquet").write_bytes(b"")
    (run / "summary.json").write_text("[]")
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stepsim: error: {run / 'summary.json'}: not a summary written by stepsim serve (ValueError: a JSON list, "
        "not an object)"]
