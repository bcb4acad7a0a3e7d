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
    ax.set_xlim(1e6, 80e9)  # wide: one label per decade
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels() if 1e6 <= t.get_position()[0] <= 80e9] == [
        "1 MB", "10 MB", "100 MB", "1 GB", "10 GB"]
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
