"""``stepsim run|metrics ... --schedule auto|paper|FILE`` (stepsim.mapping.runs): paper runs are the paper's, runs on
serving hardware are mapped by default, the record states the schedule and its run id hashes it, and every bad
schedule is one line before any simulation."""

from __future__ import annotations

import json
import shlex

import pytest
from test_map_cli import TINY, TINY_FFN_24

from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.mapping.runs import serving_hardware
from stepsim.results.records import allocated_compute_flops, run_config

TINY_RUN = "moe --model tiny.json --trace routing.npz"


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """The tiny model, a routing trace of 24 tokens and schedule files in the cwd; a mapping cache of its own."""
    from small_routing import write_small_routing

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stepsim.mapping.mapper._MEMO", {})  # nothing mapped by an earlier test in this process
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    write_small_routing(tmp_path)
    files = {"ffn24": {}, "ffn64": {"tile_n": 64}, "regions3": {"regions": 3}, "lanes8": {"lanes": 8},
             "lanes1": {"lanes": 1}, "huge": {"tile_f": 2, "lanes": 64}}
    for name, knobs in files.items():
        schedule = {**TINY_FFN_24, "knobs": {**TINY_FFN_24["knobs"], **knobs}}
        (tmp_path / f"{name}.json").write_text(json.dumps(schedule))
    (tmp_path / "decode64.json").write_text(json.dumps({"kind": "decode", "knobs": {"regions": 64}}))
    (tmp_path / "partial.json").write_text(json.dumps({"kind": "ffn", "knobs": {"tile_n": 8}}))
    return tmp_path


def record(capsys, command: str) -> dict:
    code = main(shlex.split(command + " --json"))
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


def schedule_of(row: dict):
    return json.loads(row["params"]).get("schedule")


def test_serving_hardware_is_sn40l_or_a_chip_that_sets_its_units(tmp_path):
    (tmp_path / "over_sn40l.toml").write_text('preset = "sn40l"\npmu_bw = 128\n')
    (tmp_path / "units.toml").write_text("compute_units = 520\n")
    (tmp_path / "hbm8.toml").write_text("hbm_channels = 8\n")
    chips = [Hardware.preset("sn40l"), Hardware.from_toml(tmp_path / "over_sn40l.toml"),
             Hardware.from_toml(tmp_path / "units.toml"), Hardware.preset("step-eval"), Hardware.preset("step-hdl"),
             Hardware.from_toml(tmp_path / "hbm8.toml")]
    assert [(hw.name, serving_hardware(hw)) for hw in chips] == [
        ("sn40l", True), ("sn40l+pmu_bw=128", True), ("step-eval+compute_units=520", True),
        ("step-eval", False), ("step-hdl", False), ("step-eval+hbm_channels=8", False)]


def test_paper_is_the_default_of_the_paper_hardware_and_its_run_ids_are_unchanged(tiny, capsys):
    default = record(capsys, "metrics moe")
    paper = record(capsys, "metrics moe --schedule paper")
    # the paper's Mixtral layer on its bundled trace, the run id every earlier record has
    assert default == {**paper, "build_s": default["build_s"], "metrics_s": default["metrics_s"],
                       "total_s": default["total_s"]}
    assert default["run_id"] == run_config({"workload": "moe"}).run_id == \
        "cdfece4b71d7f13199c2d996f10b4f7363d6ffeab72212230f721cc1860b3761"
    assert schedule_of(default) is None
    swiglu = record(capsys, "metrics swiglu --hardware sn40l")  # not mapped: paper, even on serving hardware
    assert swiglu["run_id"] == run_config({"workload": "swiglu", "hardware": "sn40l"}).run_id
    assert schedule_of(swiglu) is None


def test_runs_on_serving_hardware_are_mapped_and_the_record_says_how(tiny, capsys):
    code = main(shlex.split(f"run {TINY_RUN} --hardware sn40l"))
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[-1] == "schedule                           auto: ffn tile_n 8, tile_f 32, lanes 2, regions 8 (1,040 " \
                      "compute units)"
    assert "cycles                             1,409 cycles" in out
    auto = record(capsys, f"run {TINY_RUN} --hardware sn40l")
    assert (auto["cycles"], auto["tile_n"], auto["tile_f"], auto["regions"], auto["compute_bw"],
            auto["channel_depth"], auto["allocated_compute_flops_per_cycle"]) == (1409, 8, 32, 8, None, 64, 632_616)
    assert schedule_of(auto) == {"source": "auto", "kind": "ffn", "compute_units": 1040,
                                 "knobs": TINY_FFN_24["knobs"]}
    other = record(capsys, f"run {TINY_RUN} --hardware sn40l --schedule lanes1.json")  # another schedule
    assert (other["cycles"], schedule_of(other)["knobs"]["lanes"]) == (1731, 1)
    paper = record(capsys, f"run {TINY_RUN} --hardware sn40l --schedule paper")
    assert len({auto["run_id"], other["run_id"], paper["run_id"]}) == 3  # no result reused across schedules
    assert paper["cycles"] == 2168
    metrics = record(capsys, f"metrics {TINY_RUN} --hardware sn40l")
    assert (metrics["cycles"], metrics["off_chip_bytes"], schedule_of(metrics)["knobs"]) == \
        (None, auto["off_chip_bytes_symbolic"], TINY_FFN_24["knobs"])
    assert metrics["run_id"] != record(capsys, f"metrics {TINY_RUN} --hardware sn40l --schedule paper")["run_id"]


def test_auto_maps_on_the_hardware_given(tiny, capsys):
    step_eval = record(capsys, f"run {TINY_RUN} --schedule auto")
    assert (step_eval["hardware_name"], step_eval["cycles"], schedule_of(step_eval)["knobs"]) == \
        ("step-eval", 1533, TINY_FFN_24["knobs"])


def test_a_mapped_decode_attention_and_functional_checks_of_mapped_layers(tiny, capsys, ffn24_cache):
    ffn24_cache(tiny)  # the MoE run's schedule, searched once (conftest.py); the decode attention is mapped here
    attention = record(capsys, "run attention --hardware sn40l")  # the bundled batch of 16 requests
    assert (attention["cycles"], attention["regions"], schedule_of(attention)) == \
        (11_522, 16, {"source": "auto", "kind": "decode", "knobs": {"regions": 16}, "compute_units": 1040})
    checked = record(capsys, "run attention --hardware sn40l --functional --check")  # stable softmax
    assert (checked["softmax"], checked["check_passed"], schedule_of(checked)["knobs"]) == \
        ("stable", True, {"regions": 16})
    moe = record(capsys, f"run {TINY_RUN} --hardware sn40l --functional --check")
    assert (moe["cycles"], moe["check_passed"]) == (1409, True)  # a functional run times as the timing run


E = "stepsim: error: "
KNOBS_SET = "the mapped schedule sets the tiles, regions and compute_bw of one layer on one chip; give --schedule " \
            "paper to build with "
BAD = [
    ("run swiglu --schedule auto", E + "--schedule auto: the mapper does not cover workload 'swiglu'; it maps moe "
                                       "(kind ffn), attention (kind decode); give --schedule paper"),
    ("metrics decoder --hardware sn40l --schedule ffn24.json",
     E + "--schedule FILE: the mapper does not cover workload 'decoder'; it maps moe (kind ffn), attention (kind "
         "decode); give --schedule paper"),
    (f"run {TINY_RUN} --schedule decode64.json",
     E + "--schedule decode64.json: its schedule is of kind 'decode'; this moe run needs kind 'ffn' (stepsim map ffn "
         "--out FILE)"),
    ("run attention --schedule ffn24.json",
     E + "--schedule ffn24.json: its schedule is of kind 'ffn'; this attention run needs kind 'decode' (stepsim map "
         "decode --out FILE)"),
    ("run attention --hardware sn40l --schedule decode64.json",
     E + "--schedule decode64.json: regions 64 exceeds the run's 16 requests (a schedule mapped for another batch: "
         "stepsim map decode --shape 16)"),
    (f"run {TINY_RUN} --schedule ffn64.json",
     E + "--schedule ffn64.json: tile_n 64 exceeds the run's 24 tokens (a schedule mapped for another batch: "
         "stepsim map ffn --shape 24)"),
    (f"run {TINY_RUN} --schedule regions3.json",
     E + "--schedule regions3.json: regions 3 must divide the model's 8 experts"),
    (f"run {TINY_RUN} --schedule lanes8.json",
     E + "--schedule lanes8.json: tile_f 32 x lanes 8 must divide the model's intermediate size 128"),
    (f"run {TINY_RUN} --hardware sn40l --schedule huge.json",
     E + "--schedule huge.json: does not fit hardware 'sn40l': 3081 compute operators, 1040 compute units"),
    (f"run {TINY_RUN} --schedule missing.json",
     E + "--schedule: cannot read schedule file missing.json: [Errno 2] No such file or directory: 'missing.json'"),
    (f"metrics {TINY_RUN} --schedule partial.json",
     E + "--schedule: partial.json: schedule 0: a 'ffn' schedule takes the knobs tile_n, tile_f, lanes, regions; "
         "got ['tile_n']"),
    ("run moe --schedule ''", E + "--schedule must be auto, paper or a schedule file (stepsim map --out), got ''"),
    (f"run {TINY_RUN} --hardware sn40l --tile-n 16",
     E + "--tile-n does not apply with --schedule auto (the default on serving hardware 'sn40l'): " + KNOBS_SET
     + "--tile-n"),
    ("metrics moe --tiling dynamic --schedule auto",
     E + "--tiling does not apply with --schedule auto: " + KNOBS_SET + "--tiling"),
    ("run moe --ep 2 --schedule ffn24.json", E + "--ep does not apply with --schedule FILE: " + KNOBS_SET + "--ep"),
    ("run attention --strategy coarse --hardware sn40l",
     E + "--strategy does not apply with --schedule auto (the default on serving hardware 'sn40l'): " + KNOBS_SET
     + "--strategy"),
]


@pytest.mark.parametrize("command, last_line", BAD, ids=[c for c, _ in BAD])
def test_a_bad_schedule_is_one_line_before_any_run(tiny, capsys, command, last_line):
    code = main(shlex.split(command + " --out out"))
    out, err = capsys.readouterr()
    assert (code, out, err.splitlines()[-1]) == (2, "", last_line)
    assert "Traceback" not in err and not (tiny / "out").exists() and not (tiny / "cache").exists()


def test_a_written_mapped_record_is_rebuilt_with_its_schedule_for_the_report(tiny, capsys, ffn24_cache):
    import pyarrow.parquet as pq

    ffn24_cache(tiny)  # the run's schedule, searched once (conftest.py)

    from stepsim.insight.report import rebuild

    assert main(shlex.split(f"run {TINY_RUN} --hardware sn40l --out rec.parquet")) == 0
    capsys.readouterr()
    [row] = pq.read_table(tiny / "rec.parquet").to_pylist()
    units = pq.read_table(tiny / "rec_units.parquet").column("name").to_pylist()
    workload, program = rebuild(row)  # the graph the run simulated: the schedule's lanes, units and depth
    assert (workload.params["schedule"], program.n_units) == (schedule_of(row), len(units))
    assert allocated_compute_flops(workload) == row["allocated_compute_flops_per_cycle"] == 632_616
    assert main(["report", "rec.parquet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        "verdict: latency-or-imbalance-bound (1,409 cycles; memory roofline 282, compute roofline 13 cycles)"
