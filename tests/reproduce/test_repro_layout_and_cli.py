"""Trace-folder discovery, typed errors (unknown experiment, bad layout) and the command line."""

import functools
import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from repro_traces import KV_B16, tiny_traces

from stepsim.base.errors import ConfigError, StepsimError
from stepsim.cli import main
from stepsim.reproduce import JSON_KEYS, RunFailedError, TracesLayoutError, reproduce
from stepsim.reproduce.driver import EXPERIMENTS
from stepsim.reproduce.driver import reproduce as driver_reproduce
from stepsim.reproduce.execute import Runner
from stepsim.reproduce.layout import kv_windows, routing_files
from stepsim.reproduce.names import EXPERIMENT_NAMES

pytestmark = pytest.mark.traces

#: the smallest configuration that still runs every experiment (for the command-line tests)
SMALLEST = {"dynamic-tiling": {"tiles": {64: (64,)}, "models": ("mixtral-8x7b",)},
            "time-multiplexing": {"regions": (128,)},
            "validation": {"tile_m": (64,), "tile_n": (64, 128)}}


# --- discovery ----------------------------------------------------------------------------------------------
def test_routing_files_are_found_per_model_and_batch(shared_traces, tmp_path):
    traces = tiny_traces(shared_traces, tmp_path)
    found = routing_files(traces)
    assert [(f.model, f.batch, f.name) for f in found] == [("mixtral-8x7b", 64, "mixtral_b64/008_010.npz"),
                                                          ("qwen3-30b-a3b", 64, "qwen_b64/032_012.npz")]
    (traces / "expert_routing" / "deepseek_b64").mkdir()  # an unknown model folder is ignored
    assert [f.model for f in routing_files(traces, ("qwen3-30b-a3b",))] == ["qwen3-30b-a3b"]


def test_paper_windows_keep_their_class_and_other_files_are_ignored(shared_traces, tmp_path):
    extra = ("b16/conv_stdev0174_1845_1860.npy", "b16/conv_stdev0987_3275_3290.npy")
    traces = tiny_traces(shared_traces, tmp_path, routing=(), kv=(*KV_B16.values(), *extra))
    windows = kv_windows(traces)
    assert [(w.batch, w.variance, w.name) for w in windows] == [
        (16, "high", KV_B16["high"]), (16, "med", KV_B16["med"]), (16, "med", "b16/conv_stdev0987_3275_3290.npy"),
        (16, "low", KV_B16["low"])]


def test_batch_sizes_without_paper_windows_are_split_into_thirds_by_stdev(tmp_path):
    folder = tmp_path / "kv_lengths" / "b4"
    folder.mkdir(parents=True)
    for i, spread in enumerate((10, 500, 40, 300, 1000, 70)):
        np.save(folder / f"conv_stdev{spread:04d}_{10 * i + 1:04d}_{10 * i + 4:04d}.npy",
                np.array([100, 100 + spread, 100, 100 + spread], dtype=np.int64))
    windows = kv_windows(tmp_path)
    assert [(w.variance, w.start) for w in windows] == [("high", 41), ("high", 11), ("med", 31), ("med", 51),
                                                        ("low", 21), ("low", 1)]


# --- typed errors -------------------------------------------------------------------------------------------
def test_unknown_experiment_is_a_config_error_naming_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="unknown experiment 'figure-9'; expected one of dynamic-tiling, "
                                          "time-multiplexing, dynamic-parallelization, validation, all"):
        reproduce("figure-9", tmp_path, tmp_path / "out")


def test_unknown_plan_option_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="bad options for experiment 'validation'"):
        reproduce("validation", tmp_path, tmp_path / "out", options={"validation": {"tiles": (1,)}})


@pytest.mark.parametrize("experiment, missing", [("dynamic-tiling", "expert_routing"),
                                                 ("time-multiplexing", "expert_routing"),
                                                 ("dynamic-parallelization", "kv_lengths")])
def test_a_folder_without_the_layout_names_the_missing_path(tmp_path, experiment, missing):
    with pytest.raises(TracesLayoutError, match=f"{tmp_path / missing}: folder not found"):
        reproduce(experiment, tmp_path, tmp_path / "out")
    with pytest.raises(TracesLayoutError, match=f"{tmp_path / 'nowhere'}: traces folder not found"):
        reproduce(experiment, tmp_path / "nowhere", tmp_path / "out")


def test_all_checks_every_experiment_before_simulating_anything(shared_traces, tmp_path):
    traces = tiny_traces(shared_traces, tmp_path / "traces", kv=())
    with pytest.raises(TracesLayoutError, match=f"{traces / 'kv_lengths'}: folder not found"):
        reproduce("all", traces, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_layout_errors_name_the_offending_folder_or_file(shared_traces, tmp_path):
    traces = tiny_traces(shared_traces, tmp_path, kv=(KV_B16["high"], KV_B16["low"]))
    with pytest.raises(TracesLayoutError, match=rf"{traces / 'kv_lengths' / 'b16'}: no window of the paper's 'med'"):
        kv_windows(traces)
    (traces / "expert_routing" / "qwen_b32").mkdir()
    with pytest.raises(TracesLayoutError, match=f"{traces / 'expert_routing' / 'qwen_b32'}: no .npz routing files"):
        routing_files(traces)
    shutil.copy(traces / "expert_routing" / "qwen_b64" / "032_012.npz", traces / "expert_routing" / "qwen_b32")
    with pytest.raises(TracesLayoutError, match=r"qwen_b32/032_012.npz: holds 64 tokens but its folder says b32"):
        routing_files(traces)
    empty = tmp_path / "empty"
    (empty / "expert_routing" / "other").mkdir(parents=True)
    with pytest.raises(TracesLayoutError, match=f"{empty / 'expert_routing'}: no routing folder for mixtral_b<B>"):
        routing_files(empty)
    assert issubclass(TracesLayoutError, StepsimError)


def test_a_failing_point_is_a_run_failed_error_naming_it(tmp_path):
    with pytest.raises(RunFailedError, match="validation: point tile_m=3 tile_n=64 failed: ConfigError: tile_m must be "
                                             "a positive divisor of 64, got 3"):
        reproduce("validation", tmp_path, tmp_path / "out", options={"validation": {"tile_m": (3,), "tile_n": (64,)}})
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="--jobs must be an int >= 1, got 0"):
        Runner(0)


# --- command line -------------------------------------------------------------------------------------------
def test_cli_errors_exit_2_with_one_line_naming_the_problem(tmp_path, capsys):
    assert main(["reproduce", "fig9", "--traces", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("stepsim: error: unknown experiment 'fig9'")
    assert main(["reproduce", "dynamic-parallelization", "--traces", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"stepsim: error: {tmp_path / 'kv_lengths'}: folder not found in the traces " \
        f"folder {tmp_path} (expected expert_routing/<mixtral|qwen>_b<B>/*.npz and " \
        f"kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy, as in ../shared/traces)\n"


def test_the_command_module_loads_without_the_experiments_dependencies():
    # stepsim reproduce --jobs N starts its pool's fork server before it imports them (stepsim/base/forkserver.py)
    code = ("import sys, stepsim.cli.reproduce; "
            "print(sorted(m for m in ('sympy', 'pyarrow', 'numba', 'numpy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[]\n"
    assert tuple(EXPERIMENTS) == EXPERIMENT_NAMES


def test_cli_all_json_prints_exactly_the_seven_headline_keys(shared_traces, tmp_path, capsys, monkeypatch):
    traces = tiny_traces(shared_traces, tmp_path / "traces")
    monkeypatch.setattr("stepsim.reproduce.driver.reproduce", functools.partial(driver_reproduce, options=SMALLEST))
    assert main(["reproduce", "all", "--traces", str(traces), "--out", str(tmp_path / "out"), "--json", "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    headline = json.loads(captured.out)
    assert list(headline) == list(JSON_KEYS) == [
        "dynamic_tiling_onchip_reduction_geomean", "dynamic_tiling_speedup_geomean",
        "time_multiplexing_util_gain_static", "time_multiplexing_util_gain_dynamic",
        "dynamic_parallelization_speedup_geomean", "validation_pearson_cycles_vs_roofline",
        "validation_pearson_cycles_vs_hdl"]
    # two validation points (tile_m 64): no HDL point among them, so no correlation with the HDL
    assert headline["validation_pearson_cycles_vs_hdl"] is None
    # one Mixtral tile (64) within 5% of dynamic's cycles and 2x its memory; the baseline alone gains 1.0
    table = {r["tiling"]: r for r in pq.read_table(tmp_path / "out" / "dynamic_tiling.parquet").to_pylist()}
    assert headline["dynamic_tiling_onchip_reduction_geomean"] == 37_789_698 / 18_915_330
    assert headline["dynamic_tiling_speedup_geomean"] == table["static"]["cycles"] / table["dynamic"]["cycles"]
    assert headline["time_multiplexing_util_gain_static"] == headline["time_multiplexing_util_gain_dynamic"] == 1.0
    assert "[reproduce] validation: 2 simulations on 1 worker" in captured.err
    assert len(list((tmp_path / "out").glob("*.png"))) == 4


def test_cli_single_experiment_json_holds_only_its_keys_and_text_mode_reports_files(tmp_path, capsys, shared_traces):
    traces = tiny_traces(shared_traces, tmp_path / "traces", routing=())
    out = tmp_path / "out"
    assert main(["reproduce", "dynamic-parallelization", "--traces", str(traces), "--out", str(out), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["dynamic_parallelization_speedup_geomean"]
    assert main(["reproduce", "validation", "--traces", str(traces), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"validation_pearson_cycles_vs_roofline": 0.9941199880612315,
                                                   "validation_pearson_cycles_vs_hdl": 0.9367402069674382}
    assert main(["reproduce", "validation", "--traces", str(traces), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote csv: {out / 'validation.csv'}" in text
    lines = text.splitlines()
    at = lines.index("Pearson r(simulated cycles, roofline bound) over 15 points: 0.9941 (memory bound alone: 0.9935)")
    assert lines[at + 1:at + 7] == [
        "Pearson r(simulated cycles, HDL cycles) over the 5 published HDL points: 0.9367 (HDL: dse_results.csv, "
        "https://github.com/anonymous7484/step-artifact-eval (commit c2a42755b3a80d54f6be6cf515458c823982143c))",
        "  tile_m 16 tile_n  16: simulated 33,288 cycles, HDL 36,259 (-8.2 %)",
        "  tile_m 16 tile_n  32: simulated 29,399 cycles, HDL 30,432 (-3.4 %)",
        "  tile_m 16 tile_n  64: simulated 27,502 cycles, HDL 27,859 (-1.3 %)",
        "  tile_m 16 tile_n 128: simulated 26,992 cycles, HDL 29,112 (-7.3 %)",
        "  tile_m 16 tile_n 256: simulated 27,508 cycles, HDL 25,998 (+5.8 %)"]
    assert "validation: 15 simulations, done " in text and text.rstrip().splitlines()[-1].startswith("total wall time:")


def test_missing_matplotlib_skips_the_figure_with_an_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes "import matplotlib" fail
    [result] = reproduce("validation", tmp_path, tmp_path / "out", options={"validation": {"tile_m": (64,),
                                                                                            "tile_n": (64, 128)}})
    assert result.figure_note == "figure skipped: matplotlib is missing; install it with: pip install 'stepsim[plot]'"
    assert "figure" not in result.files and not (tmp_path / "out" / "validation.png").exists()
    assert (tmp_path / "out" / "validation.csv").exists()


def test_corrupt_files_fail_before_any_simulation_naming_the_path(shared_traces, tmp_path, capsys):
    traces = tiny_traces(shared_traces, tmp_path / "traces")
    bad = traces / "expert_routing" / "mixtral_b64" / "009_010.npz"
    bad.write_text("not a zip")
    assert main(["reproduce", "all", "--traces", str(traces), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"stepsim: error: {bad}: not a NumPy .npz archive (its first bytes are "
                                       "b'not '); save the array with numpy savez\n")
    assert not (tmp_path / "out").exists()
    bad.unlink()
    window = sorted((traces / "kv_lengths" / "b16").glob("*.npy"))[0]
    np.save(window, np.array([{"a": 1}] * 16, dtype=object))
    with pytest.raises(TracesLayoutError, match=rf"{window}: holds Python objects \(an object-dtype array\)"):
        kv_windows(traces)


def test_unknown_subfolders_are_listed_as_skipped(shared_traces, tmp_path):
    from stepsim.reproduce.layout import skipped_folders

    traces = tiny_traces(shared_traces, tmp_path / "traces")
    (traces / "expert_routing" / "llama_b64").mkdir()
    (traces / "kv_lengths" / "azure").mkdir()
    assert [(p.name, why) for p, why in skipped_folders(traces)] == [
        ("llama_b64", "not a routing folder of a model the paper ran (mixtral_b<B>, qwen_b<B>)"),
        ("azure", "not a b<B> folder of KV-length windows")]
    lines = []
    reproduce("validation", traces, tmp_path / "out", options={"validation": SMALLEST["validation"]},
              progress=lines.append)
    assert lines[:2] == [f"skipped {traces / 'expert_routing' / 'llama_b64'}: not a routing folder of a model the "
                         "paper ran (mixtral_b<B>, qwen_b<B>)",
                         f"skipped {traces / 'kv_lengths' / 'azure'}: not a b<B> folder of KV-length windows"]
