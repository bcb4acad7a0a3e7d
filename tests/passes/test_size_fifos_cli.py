"""``stepsim size-fifos``, the depths file and ``--fifo-depths`` / ``fifo_depths`` on run, sweeps and records.

Workload: Qwen3-30B-A3B's real B=64 routing (../shared/traces) on a reduced layer (D=32, F=192), static tile 32.
"""

import json
import tomllib

import pytest

from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.graph.depths_file import apply_depths_file, read_depths_file
from stepsim.passes import size_fifos
from stepsim.passes.sizing import REPORT_KEYS
from stepsim.results.records import run_config, run_identity
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config

DIMS = ["--model", "custom", "--hidden", "32", "--intermediate", "192", "--experts", "128", "--top-k", "8"]


@pytest.fixture(scope="module")
def trace(shared_traces):
    return str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")


def _config(trace, **extra):
    return {"workload": "moe", "model": "custom", "hidden": 32, "intermediate": 192, "experts": 128, "top_k": 8,
            "trace": trace, "tiling": "static", "tile_n": 32, **extra}


@pytest.fixture(scope="module")
def sized(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("sized")
    runs = []
    for name in ("a", "b"):  # twice: the sizing is deterministic
        code = main(["size-fifos", "moe", *DIMS, "--trace", trace, "--tiling", "static", "--tile-n", "32",
                     "--out", str(out / f"{name}.toml"), "--json"])
        assert code == 0
        runs.append(out / f"{name}.toml")
    return runs


def test_json_report_file_and_png(sized, capsys, trace):
    first, second = sized
    assert first.read_bytes() == second.read_bytes()
    assert first.with_suffix(".png").read_bytes() == second.with_suffix(".png").read_bytes()
    depths = read_depths_file(first)
    assert depths.graph == "moe-custom-static" and depths.workload == "moe"
    assert depths.config["tile_n"] == 32 and len(depths.trace_hashes) == 1
    workload = workload_from_config(_config(trace))
    assert list(depths.channels) == [f"{op}" for op in simulate(workload, channel_depth=1024).channel_names]
    sizing = tomllib.loads(first.read_text())["sizing"]  # a TOML file, read as TOML (tomli-w writes it)
    assert sorted(k for k in sizing if k in REPORT_KEYS) == sorted(REPORT_KEYS)
    # the sized depths give the reported cycles, within 1 % of 1024-deep FIFOs
    cycles = simulate(apply_depths_file(workload, first)).cycles
    assert cycles == int(sizing["cycles"]) <= int(int(sizing["unbounded_cycles"]) * 1.01)


def test_cli_json_has_the_report_keys(trace, tmp_path, capsys):
    assert main(["size-fifos", "moe", *DIMS, "--trace", trace, "--tiling", "dynamic", "--out",
                 str(tmp_path / "d.toml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == list(REPORT_KEYS)
    assert report["uniform_fifo_bytes"] == report["uniform_depth"] * report["unbounded_fifo_bytes"] // 1024


def test_run_with_fifo_depths_and_rejection_of_another_graph(sized, trace, capsys):
    path = sized[0]
    assert main(["run", "moe", *DIMS, "--trace", trace, "--tiling", "static", "--tile-n", "32", "--fifo-depths",
                 str(path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["fifo_depths"] == str(path)
    assert row["cycles"] == int(path.read_text().split("\ncycles = ")[1].split("\n")[0])
    fingerprint = read_depths_file(path).fingerprint[:12]
    assert main(["run", "moe", *DIMS, "--trace", trace, "--tiling", "static", "--tile-n", "16", "--fifo-depths",
                 str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"stepsim: error: {path}: FIFO depths made for another graph (moe-custom-static, "
                          f"fingerprint {fingerprint}) than this run's (moe-custom-static, fingerprint ")
    assert err.endswith("); size this workload with stepsim size-fifos\n")


def test_config_key_records_the_file_content_in_the_run_identity(sized, trace, tmp_path):
    copy = tmp_path / "d.toml"
    copy.write_bytes(sized[0].read_bytes())
    record = run_config(_config(trace, fifo_depths=str(copy), mode="simulate"))
    assert record.row["cycles"] == simulate(apply_depths_file(workload_from_config(_config(trace)), copy)).cycles
    before = run_identity(_config(trace, fifo_depths=str(copy), mode="simulate"))[0]
    assert before == record.run_id
    depth = read_depths_file(copy).channels["LinearOffChipLoad_0[0]"]
    text = copy.read_text()
    copy.write_text(text.replace(f'"LinearOffChipLoad_0[0]" = {depth}\n', f'"LinearOffChipLoad_0[0]" = {depth + 1}\n'))
    assert read_depths_file(copy).channels["LinearOffChipLoad_0[0]"] == depth + 1
    assert run_identity(_config(trace, fifo_depths=str(copy), mode="simulate"))[0] != before


def test_resizing_a_workload_loaded_with_its_own_output_changes_nothing(sized, trace):
    workload = apply_depths_file(workload_from_config(_config(trace)), sized[0])
    again = size_fifos(workload, uniform=False)
    assert again.depths == read_depths_file(sized[0]).channels


def test_parallel_candidates_on_the_sweep_executor_give_the_same_depths(sized, trace):
    result = size_fifos(_config(trace), jobs=2, uniform=False)
    assert result.depths == read_depths_file(sized[0]).channels


@pytest.mark.parametrize("content, message", [
    ("[workload\n", "not a valid TOML file"),
    ("[channels]\na = 1\n", "not a FIFO depths file (needs [workload] with a fingerprint and [channels]; write one "
                           "with stepsim size-fifos)"),
    ('[workload]\nfingerprint = "x"\n[channels]\n"Map_1[0]" = 0\n',
     "[channels] 'Map_1[0]' must be an int >= 1 (elements), got 0"),
    ('[workload]\nfingerprint = "x"\n[channels]\n"Map_1[0]" = "deep"\n',
     "[channels] 'Map_1[0]' must be an int >= 1 (elements), got 'deep'"),
])
def test_bad_depths_files_are_one_line_errors_naming_the_file(tmp_path, content, message):
    path = tmp_path / "d.toml"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_depths_file(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_cli_input_fails_before_any_work(tmp_path, capsys, trace):
    base = ["size-fifos", "moe", *DIMS, "--trace", trace]
    assert main([*base, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"stepsim: error: --out {tmp_path}: is a folder; give a file name\n"
    (tmp_path / "f").write_text("")
    assert main([*base, "--out", str(tmp_path / "f" / "d.toml")]) == 2
    assert capsys.readouterr().err == (f"stepsim: error: --out {tmp_path / 'f' / 'd.toml'}: {tmp_path / 'f'} is "
                                       "a file, not a folder\n")
    assert main([*base, "--out", str(tmp_path / "d.toml"), "--slack", "1.5"]) == 2
    assert capsys.readouterr().err == "stepsim: error: --slack must be in [0, 1) (0.01 = 1 %), got 1.5\n"
    assert main(["run", "moe", *DIMS, "--trace", trace, "--fifo-depths", str(tmp_path / "missing.toml")]) == 2
    assert capsys.readouterr().err.startswith(f"stepsim: error: {tmp_path / 'missing.toml'}: cannot read FIFO "
                                              "depths file: No such file or directory")
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_sizing_on_several_traces_holds_on_each(trace, tmp_path):
    from stepsim.workloads.config import bundled_trace

    other = bundled_trace("qwen3-30b-a3b")  # a synthetic B=64 routing: the same graph, other counts
    result = size_fifos(_config(trace), traces=[trace, other], uniform=False)
    assert len(result.trace_hashes) == 2 and result.trace_hashes[0] != result.trace_hashes[1]
    worst = 0
    for path in (trace, other):
        workload = workload_from_config(_config(path))
        unbounded = simulate(workload, channel_depth=1024).cycles
        cycles = simulate(workload, channel_depths=result.depths).cycles
        assert cycles <= int(unbounded * 1.01)
        worst = max(worst, cycles)
    assert result.cycles == worst


def test_sweep_key_fifo_depths_resolves_against_the_sweep_file(sized, trace, tmp_path):
    from stepsim.batch.rows import read_sweep

    (tmp_path / "d.toml").write_bytes(sized[0].read_bytes())
    (tmp_path / "sweep.toml").write_text(
        'workload = "moe"\nmode = "simulate"\nout = "res"\n[fixed]\nmodel = "custom"\nhidden = 32\n'
        f'intermediate = 192\nexperts = 128\ntop_k = 8\ntrace = "{trace}"\ntiling = "static"\n'
        'fifo_depths = "d.toml"\n[axes]\ntile_n = [32]\n')
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--no-progress"]) == 0
    rows = read_sweep(tmp_path / "res").to_pylist()
    assert [(r["fifo_depths"], r["status"]) for r in rows] == [(str(tmp_path / "d.toml"), "ok")]
    assert rows[0]["cycles"] == simulate(apply_depths_file(workload_from_config(_config(trace)), sized[0])).cycles
