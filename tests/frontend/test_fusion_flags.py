"""The fusion policy on the command line (issue 33): ``--no-fuse`` spills every edge of an .onnx model, ``--spill
NAME[,NAME...]`` the edges named (a value: all its edges; ``VALUE->CONSUMER``: one), on run, metrics, graph show
and optimize (where ``--no-fuse`` fixes the fusion axis); the record, its text and ``stepsim report`` say which
edges spilled and why, and which converters a spill replaced. Numbers are exact: the diamond's tensor is
``B x S x D`` fp32 (2,048 B), each spill moves it twice (written, read back)."""

import json
import sys
from pathlib import Path

import onnx
import pytest

from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.results.records import read_runs, run_identity
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_spill import B, D, S, diamond, engines_agree, heads, leading  # noqa: E402

TENSOR = B * S * D * 4  # 2,048 B: x, h, r, y
FUSED = TENSOR + 2 * D * D * 4 + TENSOR  # x, the weight once per row block (tile_m 8: 2 blocks), y


@pytest.fixture()
def path(tmp_path):
    p = tmp_path / "diamond.onnx"
    onnx.save(diamond(), p)
    return p


def _json(capsys, *args) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_no_fuse_and_spill_change_cycles_and_bytes_exactly(path, capsys):
    fused = _json(capsys, "run", str(path))
    off = _json(capsys, "run", str(path), "--no-fuse")
    one = _json(capsys, "run", str(path), "--spill", "h->act")
    assert (fused["cycles"], fused["off_chip_bytes"]) == (289, FUSED)
    assert (off["cycles"], off["off_chip_bytes"]) == (547, FUSED + 3 * 2 * TENSOR)  # h->act, h->res, r->res
    # h->act spilled: res then reads r (after the spill) and h (before it): h->res spills too; r->res stays fused
    assert json.loads(one["params"])["spilled"] == ["h->act", "h->res"]
    assert [(e.value, e.consumer) for e in from_onnx(diamond(), spill=("h -> act",)).frontend.spilled()] == [
        ("h", "act"), ("h", "res")]  # the name as describe() prints it
    assert one["off_chip_bytes"] == FUSED + 2 * 2 * TENSOR
    for row, kw in ((fused, {}), (off, {"fuse": False}), (one, {"spill": ("h->act",)})):
        w = from_onnx(path, values="seeded", routing="teacher", **kw)
        assert row["cycles"] == engines_agree(w).cycles == simulate(w).cycles
        assert row["off_chip_bytes"] == w.metrics()["off_chip_bytes"]
    assert (off["no_fuse"], off["spill"], one["no_fuse"], one["spill"]) == (True, None, None, "h->act")
    # the record names the knob as the user gave it (the CLI flag, and the API argument for Python callers)
    assert json.loads(off["params"])["spill_reasons"] == dict.fromkeys(
        ("h->act", "h->res", "r->res"), "fusion is off (--no-fuse; fuse=False in the API)")
    assert _json(capsys, "metrics", str(path), "--no-fuse")["off_chip_bytes"] == off["off_chip_bytes"]
    assert _json(capsys, "metrics", str(path), "--spill", "h")["off_chip_bytes"] == FUSED + 2 * 2 * TENSOR


def test_the_record_says_which_edges_spilled_and_why_read_back(path, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(path), "--spill", "r", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    reasons = {"h->res": "res also reads a spilled tensor, whole; streamed, this edge would stall its producer "
                         "(deadlock)",
               "r->res": "named in spill="}
    assert ("spilled_edges                      2\n"
            f"  h->res: {reasons['h->res']}\n"
            f"  r->res: {reasons['r->res']}\n") in text
    (row,) = read_runs(out).to_pylist()
    assert (row["no_fuse"], row["spill"], row["cycles"]) == (None, "r", 426)
    assert row["cycles"] == simulate(from_onnx(path, values="seeded", routing="teacher", spill=("r",))).cycles
    params = json.loads(row["params"])
    assert (params["spilled"], params["spill_reasons"], params["spilled_converters"]) == (
        ["h->res", "r->res"], reasons, {})
    assert main(["report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spills"] == {"edges": reasons, "converters": {}}
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.endswith(
        f"spilled edges: 2\n  h->res: {reasons['h->res']}\n  r->res: {reasons['r->res']}\n")
    # the same run again without --spill is another run (its identity has the knob only when set)
    assert main(["run", str(path), "--out", str(out)]) == 0
    capsys.readouterr()
    rows = read_runs(out).to_pylist()
    assert sorted((r["spill"] or "", json.loads(r["params"])["spill_reasons"] == {}) for r in rows) == [
        ("", True), ("r", False)]


def test_a_converter_replaced_by_a_spill_is_in_the_record(tmp_path, capsys):
    p = tmp_path / "leading.onnx"
    onnx.save(leading(), p)
    # x [3, 4, 16], tile_m 1: the Transpose of the (3, 4) grid of one-row tiles holds (3 - 1) (4 - 1) + 1 tiles of
    # 16 fp32, unless the spill reads r back in its order
    tile = 16 * 4
    fused = _json(capsys, "metrics", str(p))
    row = _json(capsys, "metrics", str(p), "--spill", "r")
    assert json.loads(fused["params"])["spilled_converters"] == {}
    what = (f"reorder of y ({7 * tile} B): Layout(tensor 3x4x16, tile 1x1x16, loops [d0:3x1, d1:4x1]) -> "
            f"Layout(tensor 3x4x16, tile 1x1x16, loops [d1:4x1, d0:3x1])")
    assert json.loads(row["params"])["spilled_converters"] == {"t": what}
    # the spill holds one tile in its store and one in its load, and the 8-byte completion token
    assert row["on_chip_bytes"] == fused["on_chip_bytes"] - 7 * tile + 2 * tile + 8
    assert main(["metrics", str(p), "--spill", "r"]) == 0
    assert ("spilled_edges                      1\n  r->t: named in spill=\n"
            f"  converter t ({what}): replaced by a spill\n") in capsys.readouterr().out


def test_graph_show_builds_the_spill(path, capsys):
    assert main(["graph", "show", str(path)]) == 0
    fused = capsys.readouterr().out
    assert main(["graph", "show", str(path), "--no-fuse"]) == 0
    spilled = capsys.readouterr().out
    assert "spill_write" not in fused
    assert [line.split()[0] for line in spilled.splitlines() if line.startswith("spill_write")] == [
        "spill_write[h->act]", "spill_write[h->res]", "spill_write[r->res]"]


def test_the_knobs_enter_the_run_id_only_when_they_change_the_run(path):
    base = {"workload": "program", "program": str(path)}
    ident = run_identity(base)[0]
    assert run_identity({**base, "no_fuse": False})[0] == ident  # the default spelled out
    assert len({ident, run_identity({**base, "no_fuse": True})[0], run_identity({**base, "spill": "h"})[0]}) == 3
    with pytest.raises(ConfigError) as err:
        run_identity({**base, "no_fuse": "yes"}, source="sweep.toml")
    assert str(err.value) == "sweep.toml: config key 'no_fuse' must be true or false, got 'yes'"


def test_bad_names_and_flags_are_one_line_and_status_2(path, tmp_path, capsys):
    assert main(["metrics", str(path), "--spill", "h,zz"]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --spill: 'zz' is no edge of model 'diamond'; its edges' "
                                       "values: h, r (a value spills all its edges, VALUE->CONSUMER one)\n")
    assert main(["run", str(path), "--spill", "h->fc"]) == 2
    assert "'h->fc' is no edge of model 'diamond'" in capsys.readouterr().err
    assert main(["metrics", "swiglu", "--no-fuse"]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --no-fuse does not apply to workload 'swiglu' (it applies "
                                       "to: program)\n")
    prog = tmp_path / "prog.py"
    prog.write_text("from stepsim.workloads.swiglu.build import build_swiglu\n"
                    "def f():\n    return build_swiglu()\n")
    assert main(["metrics", f"{prog}:f", "--spill", "h"]) == 2
    assert capsys.readouterr().err == (f"stepsim: error: --spill applies to a program only when it is an ONNX model "
                                       f"(.onnx: its fusion), got '{prog}:f'\n")
    assert main(["optimize", str(path), "--spill", "h", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --spill does not apply to optimize: it searches which edges "
                                       "spill (--no-fuse fixes every edge spilled)\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [",,", "h,,r", "h,", " ", ", h"])
def test_spill_lists_with_an_empty_name_are_refused(path, tmp_path, capsys, value):
    # * ',,' named nothing and ran as the fused model (exit 0): a silent no-op
    for command in ("run", "metrics"):
        out = tmp_path / command
        assert main([command, str(path), "--spill", value, "--out", str(out)]) == 2
        assert capsys.readouterr() == ("", f"stepsim: error: --spill {value!r}: an empty name in the list; expected "
                                           "NAME[,NAME...], each a value or VALUE->CONSUMER\n")
        assert not out.exists()
    with pytest.raises(ConfigError) as err:  # a sweep or run file names its key, the Python API the same
        run_identity({"workload": "program", "program": str(path), "spill": value}, source="sweep.toml")
    assert str(err.value) == (f"sweep.toml: config key 'spill' {value!r}: an empty name in the list; expected "
                              "NAME[,NAME...], each a value or VALUE->CONSUMER")


@pytest.mark.parametrize("hierarchical", [False, True])
def test_optimize_no_fuse_searches_tiles_with_every_edge_spilled(path, tmp_path, capsys, hierarchical):
    out = tmp_path / "opt"
    doc = _json(capsys, "optimize", str(path), "--no-fuse", "--out", str(out),
                *(["--hierarchical"] if hierarchical else []))
    assert doc == json.loads((out / "optimize.json").read_text())
    for p in doc["pareto"]:  # every point is the all-spilled lowering of its tiling
        tiling = {k: v for k, v in p.items() if k in ("tile_m", "tile_n", "per_node")}
        w = from_onnx(path, values="seeded", routing="teacher", tiling=tiling, fuse=False)
        assert len(w.frontend.spilled()) == 3
        assert (p["cycles"], p["on_chip_bytes"]) == (simulate(w).cycles, w.metrics()["on_chip_bytes"])
    if hierarchical:
        off = dict.fromkeys(("h", "r"), "spilled: fusion is off (--no-fuse; fuse=False in the API)")
        assert doc["fusion"] == off and doc["fusion_by_tile_m"] == {"1": off, "2": off, "4": off, "8": off}
        assert all(p["spill"] == [] for p in doc["pareto"])
    else:
        assert all("spill" not in p for p in doc["pareto"])


def test_optimize_hierarchical_json_has_fusion_by_tile_m(tmp_path, capsys):
    p = tmp_path / "heads.onnx"
    onnx.save(heads(), p)
    out = tmp_path / "opt"
    doc = _json(capsys, "optimize", str(p), "--hierarchical", "--out", str(out))
    assert doc == json.loads((out / "optimize.json").read_text())
    fused, kept = "fused: no front point at this tile_m spills it", "spilled: in 1 of the {} front points at this tile_m"
    # the head Transpose's reorder converter holds ((8 / tile_m - 1) * 3 + 1) tiles: spilling its input gains on
    # chip below tile_m 8 (one front point of each such tile_m spills it); at tile_m 8 (the default, reported as
    # "fusion") the converter holds nothing
    assert doc["fusion_by_tile_m"] == {str(tm): {"p0": fused, "p1": kept.format(n) if tm < 8 else fused, "p2": fused}
                                       for tm, n in ((1, 1), (2, 2), (4, 2), (8, 1))}
    assert doc["fusion"] == doc["fusion_by_tile_m"]["8"]
    assert doc["simulations"] == 8
