"""``stepsim reproduce serving-validation``: stepsim's predictions beside SambaNova's published SN40L figures
(stepsim/serve/validation.py); docs/validation.md's table is its output."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from stepsim.cli import main
from stepsim.serve.validation import FIGURES, SOCKETS, markdown, median_ratio_error

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


def test_the_validation_table_is_regenerated_and_is_the_docs(tmp_path, capsys):
    assert main(["reproduce", "serving-validation", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    text = (tmp_path / "serving_validation.md").read_text(encoding="utf-8")
    assert printed == text + f"wrote table: {tmp_path / 'serving_validation.parquet'}\n" \
                             f"wrote markdown: {tmp_path / 'serving_validation.md'}\n"
    assert text in DOC.read_text(encoding="utf-8")
    table = pq.read_table(tmp_path / "serving_validation.parquet")
    rows = table.to_pylist()
    assert [(r["model"], r["sockets"]) for r in rows] == [(f.model, n) for f in FIGURES for n in SOCKETS]
    assert table.schema.field("tpot_s").metadata == {b"unit": b"s"}
    by = {(r["model"], r["sockets"]): r for r in rows}
    llama8 = by[("llama-3.1-8b", 16)]
    assert llama8["tokens_per_s"] == 1 / llama8["tpot_s"]
    assert llama8["ratio"] == llama8["tokens_per_s"] / 1042
    # 16 sockets' HBM roofline: 1.6 TB/s each over the 15,009,325,056 bytes a Llama-3.1-8B token reads
    assert llama8["roofline_tokens_per_s"] == 16 * 1.6e12 / 15_009_325_056
    assert by[("llama-3.1-405b", 8)]["tpot_s"] is None  # its 810 GB of weights do not fit 8 sockets
    assert by[("deepseek-r1", 16)]["note"].startswith("MLA attention")
    # the README's headline: the median over the 16-socket rows with a prediction (8B, 70B, 405B)
    import stepsim.serve.validation as validation
    rebuilt = [validation.Row(**r) for r in rows]
    assert markdown(rebuilt) == text
    assert round(median_ratio_error(rebuilt), 2) == 0.61


def test_serving_validation_prints_its_headline_as_json(tmp_path, capsys):
    assert main(["reproduce", "serving-validation", "--out", str(tmp_path), "--json"]) == 0
    headline = json.loads(capsys.readouterr().out)
    assert list(headline) == ["serving_validation_median_ratio_error"]
    assert round(headline["serving_validation_median_ratio_error"], 2) == 0.61


def test_the_paper_experiments_still_need_traces(tmp_path, capsys):
    assert main(["reproduce", "validation", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("stepsim: error: reproduce validation: --traces DIR is required (a "
                                               "folder laid out like ../shared/traces)")
