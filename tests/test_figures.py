"""Every figure stepsim draws goes through stepsim.base.figures and is produced without a warning (warnings are
errors here); axis ticks read like the CLI (decimal prefixes, no crowded log labels)."""

from __future__ import annotations

import functools
import re
import struct
import warnings
from pathlib import Path

import pytest

from stepsim.cli import main

PACKAGE = Path(__file__).resolve().parents[1] / "stepsim"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def _without_warnings(argv: list[str], capsys) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def test_only_base_figures_touches_matplotlibs_backend_and_files():
    """require_matplotlib picks the Agg backend and save_figure writes atomically and reproducibly: no other
    module may pick a backend, import pyplot or save a figure itself."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "base" / "figures.py":
            continue
        text = path.read_text()
        for pattern in (r"\.savefig\(", r"matplotlib\.use\(", r"import matplotlib\.pyplot", r"^\s*import matplotlib\b"):
            if re.search(pattern, text, re.M):
                offenders.append(f"{path.relative_to(PACKAGE)}: {pattern}")
    assert offenders == []


def test_log_axis_ticks_read_like_the_cli():
    from stepsim.base.figures import require_matplotlib, si_axis

    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot([55e6, 330e6], [560e3, 1.05e6])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(55e6, 330e6)
    ax.set_ylim(560e3, 1.05e6)
    si_axis(ax.xaxis, "B")
    si_axis(ax.yaxis)
    fig.canvas.draw()
    shown = [(t.get_position()[0], t.get_text()) for t in ax.get_xticklabels() if 55e6 <= t.get_position()[0] <= 330e6]
    assert [text for _, text in shown] == ["100 MB", "200 MB", "300 MB"]  # 1,2,3,5x: 6 labels at most on x
    ys = [t.get_text() for t in ax.get_yticklabels() if 560e3 <= t.get_position()[1] <= 1.05e6]
    assert ys == ["600k", "700k", "800k", "900k", "1M"]  # under a decade: every integer multiple
    ax.set_xlim(65e6, 330e6)  # 70, 80, 90 MB would crowd the left of a log axis: 1,2,3,5x
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels() if 65e6 <= t.get_position()[0] <= 330e6] == [
        "100 MB", "200 MB", "300 MB"]
    ax.set_xlim(1e6, 80e9)  # wide: one label per decade
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels() if 1e6 <= t.get_position()[0] <= 80e9] == [
        "1 MB", "10 MB", "100 MB", "1 GB", "10 GB"]
    ax.set_xlim(201.34e6, 201.50e6)  # within one step of 1-9x (optimize --max-chips' on-chip axis): a few round
    fig.canvas.draw()  # values, not matplotlib's fallback of a label every 0.02 MB
    assert [t.get_text() for t in ax.get_xticklabels() if 201.34e6 <= t.get_position()[0] <= 201.50e6] == [
        "201.34 MB", "201.4 MB", "201.46 MB"]
    plt.close(fig)


def test_report_optimize_size_fifos_and_demo_figures(tmp_path, capsys):
    from stepsim.workloads.config import bundled_trace

    run = tmp_path / "run"
    _without_warnings(["run", "attention", "--strategy", "coarse", "--out", run], capsys)
    out = _without_warnings(["report", run, "--png", tmp_path / "report.png"], capsys)
    assert out.splitlines()[-1] == f"wrote png: {tmp_path / 'report.png'}"
    width, height = _png_size(tmp_path / "report.png")
    assert (width, height) == (1300, 300)  # bars and, from the timeline, the heat map beside them
    _without_warnings(["optimize", "attention", "--trace", bundled_trace("attention"), "--out", tmp_path / "opt"],
                      capsys)
    assert _png_size(tmp_path / "opt" / "pareto.png")[0] == 1000  # two panels: on-chip and compute
    _without_warnings(["size-fifos", "swiglu", "--out", tmp_path / "depths.toml"], capsys)
    assert _png_size(tmp_path / "depths.png")[0] == 800
    _without_warnings(["demo", "--metrics-only", "--out", tmp_path / "demo"], capsys)
    assert _png_size(tmp_path / "demo" / "moe_tiling.png") == (640, 440)
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == ["depths.png", "moe_tiling.png", "pareto.png",
                                                                "report.png"]
    assert list(tmp_path.rglob("*.tmp*")) == []


@pytest.mark.traces
def test_the_four_reproduce_figures(shared_traces, tmp_path, capsys, monkeypatch):
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "reproduce"))
    from repro_traces import tiny_traces

    from stepsim.reproduce.driver import reproduce as driver_reproduce

    small = {"dynamic-tiling": {"tiles": {64: (16, 64)}},
             "time-multiplexing": {"regions": (128, 64)}}
    monkeypatch.setattr("stepsim.reproduce.driver.reproduce", functools.partial(driver_reproduce, options=small))
    traces = tiny_traces(shared_traces, tmp_path / "traces")
    _without_warnings(["reproduce", "all", "--traces", traces, "--out", tmp_path / "out"], capsys)
    sizes = {p.name: _png_size(p) for p in sorted((tmp_path / "out").glob("*.png"))}
    assert list(sizes) == ["dynamic_parallelization.png", "dynamic_tiling.png", "time_multiplexing.png",
                           "validation.png"]
    assert sizes["dynamic_tiling.png"][0] == 1040  # one panel per routing batch (Mixtral, Qwen)


@pytest.fixture
def drawn(monkeypatch):
    """The figures save_figure is given (laid out and drawn, then saved as usual)."""
    from stepsim.base import figures

    captured = []
    real = figures.save_figure

    def keep(fig, path, **kwargs):
        fig.tight_layout(rect=kwargs.get("rect"))  # the layout save_figure gives it, read before it is closed
        captured.append(_texts(fig))
        return real(fig, path, **kwargs)

    monkeypatch.setattr(figures, "save_figure", keep)
    return captured


def _texts(fig) -> dict:
    """What a reader sees: titles, axis labels, tick labels, annotations, and whether annotations stay inside."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = {"suptitle": fig._suptitle.get_text() if fig._suptitle else None, "axes": []}
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        notes = [(a.get_text(), box.x0 - 1 <= a.get_window_extent(renderer).x0 and
                  a.get_window_extent(renderer).x1 <= box.x1 + 1) for a in ax.texts]
        out["axes"].append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                            "xticks": [t.get_text() for t in ax.get_xticklabels() if t.get_text() and
                                       min(ax.get_xlim()) <= t.get_position()[0] <= max(ax.get_xlim())],
                            "yticks": [t.get_text() for t in ax.get_yticklabels() if t.get_text() and
                                       min(ax.get_ylim()) <= t.get_position()[1] <= max(ax.get_ylim())],
                            "notes": notes})
    out["figtext"] = [t.get_text() for t in fig.texts if t is not fig._suptitle]
    return out


def test_pareto_plot_numbers_its_front_on_two_panels_with_the_clis_counts(tmp_path, drawn):
    from stepsim.optimize import optimize
    from stepsim.optimize.output import LABELLED
    from stepsim.workloads.config import bundled_trace

    result = optimize("attention", out=tmp_path / "opt", trace=bundled_trace("attention"), jobs=1)
    [texts] = drawn
    assert texts["suptitle"] == (f"stepsim optimize attention: {result.simulations} simulations of "
                                 f"{result.candidates} candidates; front over cycles, on-chip memory and compute "
                                 f"({len(result.front)} points)")
    on_chip, compute = texts["axes"][:2]
    assert (on_chip["xlabel"], compute["xlabel"], on_chip["ylabel"]) == (
        "on-chip memory (B)", "allocated compute (FLOP/cycle)", "cycles")
    numbers = sorted(int(n) for text, _ in on_chip["notes"] for n in text.split(","))
    assert numbers == list(range(1, len(result.front) + 1))  # every front point numbered, once
    assert [text for text, _ in compute["notes"]] == [text for text, _ in on_chip["notes"]]
    assert on_chip["yticks"] and compute["yticks"] == on_chip["yticks"]  # the shared cycles axis labelled on both
    shown = min(len(result.front), LABELLED)
    assert texts["figtext"][0].splitlines()[:shown] == [
        f"{i}{'*' if c is result.recommended else ''}: {c.label(result.axes)}"
        for i, c in enumerate(result.front[:shown], 1)]


def test_demo_and_depths_plots_keep_their_labels_inside_and_bytes_in_cli_form(tmp_path, capsys, drawn):
    from stepsim.base.display import format_bytes

    assert main(["demo", "--metrics-only", "--out", str(tmp_path / "demo")]) == 0
    [demo] = drawn
    [ax] = demo["axes"]
    assert [text for text, _ in ax["notes"]] == ["tile 8", "tile 16", "tile 32", "tile 64"]
    assert all(inside for _, inside in ax["notes"])  # "tile 64" was clipped at the right edge
    assert all(t.endswith("MB") for t in ax["xticks"]) and ax["title"] == (
        "MoE layer mixtral-8x7b, synthetic_routing_mixtral_b64.arrow")
    preset_file = Path(__file__).resolve().parents[1] / "stepsim" / "data" / "models" / "qwen3-30b-a3b.json"
    assert main(["demo", "--metrics-only", "--model", str(preset_file), "--out", str(tmp_path / "q")]) == 0
    assert drawn[1]["axes"][0]["title"] == "MoE layer qwen3-30b-a3b.json, synthetic_routing_qwen_b64.arrow"
    assert main(["size-fifos", "moe", "--model", "mixtral", "--out", str(tmp_path / "d.toml"), "--jobs", "1"]) == 0
    depths = drawn[2]["axes"][0]
    sized = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FIFO bytes")]
    assert depths["title"] == (f"moe-mixtral-8x7b-static: FIFOs {sized[3].split()[3]} {sized[3].split()[4]} at depth "
                               f"1024 -> {sized[0].split()[3]} {sized[0].split()[4]} sized")
    assert depths["xticks"] == ["1 MB", "10 MB", "100 MB", "1 GB", "10 GB"]
    assert {text for text, _ in depths["notes"]} >= {format_bytes(8_589_934_592), format_bytes(8_388_608)}


@pytest.fixture
def serve_drawn(monkeypatch):
    """What each serve figure shows, read from the figure save_figure is given: per panel the axes' scales,
    their tick labels in view, the lines drawn and the texts; the caption under the figure."""
    from stepsim.serve import figures

    captured = []
    real = figures.save_figure

    def keep(fig, path, **kwargs):
        fig.tight_layout(rect=kwargs.get("rect"))
        fig.canvas.draw()
        panels = []
        for ax in fig.axes:
            def shown(labels, lim, index):
                return [t.get_text() for t in labels if t.get_text() and min(lim) <= t.get_position()[index] <= max(lim)]

            panels.append({"title": ax.get_title(), "scales": (ax.get_xscale(), ax.get_yscale()),
                           "xticks": shown(ax.get_xticklabels(), ax.get_xlim(), 0),
                           "yticks": shown(ax.get_yticklabels(), ax.get_ylim(), 1),
                           "lines": [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()))
                                     for line in ax.get_lines()],
                           "texts": [t.get_text() for t in ax.texts]})
        captured.append({"panels": panels, "caption": [t.get_text() for t in fig.texts if t is not fig._suptitle]})
        return real(fig, path, **kwargs)

    monkeypatch.setattr(figures, "save_figure", keep)
    return captured


def _serve_figure(function, table: dict, tmp_path, **kwargs):
    import pyarrow as pa

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return function(pa.table(table), tmp_path / "figure.png", title="t", **kwargs)


FRACTIONS = ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]


def test_latency_cdf_log_only_over_a_decade_labelled_between_powers_of_ten_a_constant_as_one_line(tmp_path,
                                                                                                serve_drawn):
    import numpy as np

    from stepsim.serve.figures import latency_cdf

    table = {"ttft_s": [0.007, 0.01, 0.05, 0.17, 0.08], "tpot_s": [0.0011] * 5, "e2e_s": [0.1, 0.11, 0.2, 0.23, 0.29]}
    _serve_figure(latency_cdf, table, tmp_path, slo={"ttft": 0.1, "tpot": 0.002})
    [ttft, tpot, e2e] = serve_drawn[0]["panels"]
    assert [p["title"] for p in (ttft, tpot, e2e)] == ["time to first token", "time per output token",
                                                      "end-to-end latency"]
    # 7 to 170 ms: more than a decade, log, labelled at 2x and 5x as well (not only at 10 and 100 ms)
    assert (ttft["scales"], ttft["xticks"], ttft["yticks"]) == (("log", "linear"), ["10 ms", "20 ms", "50 ms",
                                                                                    "100 ms"], FRACTIONS)
    assert ttft["lines"][0][1] == [0.007, 0.007, 0.01, 0.05, 0.08, 0.17]  # the CDF's steps, from 0 at the first
    assert ttft["lines"][0][2] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert ttft["lines"][1][0] == "SLO 100 ms"
    # every TPOT the same: one vertical line, its value written beside it; a linear axis up to the SLO
    assert tpot["scales"] == ("linear", "linear") and tpot["texts"] == ["all 5: 1.1 ms"]
    assert tpot["lines"][0][1:] == ([0.0011, 0.0011], [0.0, 1.0])
    assert tpot["xticks"] == ["1.2 ms", "1.4 ms", "1.6 ms", "1.8 ms", "2 ms"] and tpot["yticks"] == FRACTIONS
    # 100 to 290 ms: under a decade, linear
    assert (e2e["scales"], e2e["xticks"], e2e["yticks"]) == (("linear", "linear"), ["100 ms", "150 ms", "200 ms",
                                                                                    "250 ms", "300 ms"], FRACTIONS)
    assert np.allclose(e2e["lines"][0][1], [0.1, 0.1, 0.11, 0.2, 0.23, 0.29])


def test_latency_cdf_says_when_a_metric_has_no_data(tmp_path, serve_drawn):
    from stepsim.serve.figures import latency_cdf

    _serve_figure(latency_cdf, {"ttft_s": [0.01, 0.02], "tpot_s": [None, None], "e2e_s": [0.01, 0.02]}, tmp_path)
    tpot = serve_drawn[0]["panels"][1]
    assert (tpot["texts"], tpot["lines"], tpot["xticks"], tpot["yticks"]) == (
        ["no data:\nno request has a time per output token"], [], [], [])
    # 20 ms up to float rounding (an --iteration-latency run): one value, one line
    _serve_figure(latency_cdf, {"ttft_s": [0.01, 0.02, 0.03], "tpot_s": [0.01999999999999602, 0.02, 0.020000000000010232],
                                "e2e_s": [0.01, 0.02, 0.03]}, tmp_path)
    tpot = serve_drawn[1]["panels"][1]
    assert (tpot["texts"], tpot["lines"][0][1:]) == (["all 3: 20 ms"], ([0.02, 0.02], [0.0, 1.0]))


def _iterations(waiting, kv_blocks):
    n = len(kv_blocks)
    return {"start_s": [0.01 * i for i in range(n)], "duration_s": [0.01] * n, "tokens": [1 + i % 7 for i in range(n)],
            "waiting": waiting, "kv_blocks_used": kv_blocks}


def test_over_time_drops_the_panels_of_series_that_never_change_and_says_their_value(tmp_path, serve_drawn):
    from stepsim.serve.figures import over_time

    _serve_figure(over_time, _iterations([0] * 100, list(range(100))), tmp_path, usable_blocks=476_758)
    figure = serve_drawn[0]
    assert [p["title"] for p in figure["panels"]] == ["tokens computed (prefill + decode)",
                                                      "KV blocks in use (of 476,758 usable)"]
    assert figure["caption"] == ["waiting requests: 0 requests throughout the run"]
    throughput, blocks = figure["panels"]
    assert throughput["xticks"] == ["0 s", "200 ms", "400 ms", "600 ms", "800 ms", "1 s"]
    assert throughput["yticks"] == ["0", "200", "400", "600", "800"]
    assert blocks["yticks"] == ["0", "15", "30", "45", "60", "75", "90"]
    assert [label for label, *_ in blocks["lines"]] == ["_child0"]  # no usable-blocks line 4,767x above the data
    assert all(p["scales"] == ("linear", "linear") for p in figure["panels"])


def test_over_time_draws_the_usable_blocks_when_the_cache_fills_and_says_when_there_are_no_steps(tmp_path,
                                                                                                serve_drawn):
    from stepsim.serve.figures import over_time

    _serve_figure(over_time, _iterations([i % 3 for i in range(50)], [4 * i for i in range(50)]), tmp_path,
                  usable_blocks=1000)
    assert [p["title"] for p in serve_drawn[0]["panels"]] == [
        "tokens computed (prefill + decode)", "waiting requests", "KV blocks in use (of 1,000 usable)"]
    assert serve_drawn[0]["caption"] == []
    assert serve_drawn[0]["panels"][2]["lines"][1][0] == "usable 1,000"
    assert serve_drawn[0]["panels"][1]["yticks"] == ["0", "1", "2"]  # whole requests
    _serve_figure(over_time, _iterations([], []), tmp_path, usable_blocks=1000)
    [empty] = serve_drawn[1]["panels"]
    assert (empty["texts"], empty["xticks"], empty["yticks"]) == (["no data: the run has no steps"], [], [])
