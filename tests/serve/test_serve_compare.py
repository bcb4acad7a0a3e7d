"""``stepsim compare`` on serve outputs: each gate outcome with its exact lines and exit status."""

from __future__ import annotations

import json
import shutil

import pytest
from serve_requests import requests_file

import stepsim
from stepsim.cli import main
from stepsim.insight.compare import compare
from stepsim.results.serve_record import read_serve_folder

T = 2.0**-6  # binary-exact step time (s)
MODEL = "qwen3-30b-a3b"
LABEL = ("requests_file=t.parquet model=qwen3-30b-a3b hardware=sn40l scheduler={policy} max_num_seqs=128 "
         "{budget}chunk_tokens={chunk} block_size=16 fidelity=iteration-latency seed=0 iteration_latency=0.015625")
VLLM = LABEL.format(policy="vllm", budget="max_num_batched_tokens=2048 ", chunk=0)
ORCA = LABEL.format(policy="orca", budget="", chunk=0)


ARRIVALS, PROMPTS, OUTPUTS = [0.0, 0.01, 0.02, 0.5], [100, 20, 300, 50], [5, 3, 8, 2]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``served(step seconds, scheduler)``: ``(result, folder)`` of a serve run of the 4 requests, made once for the
    module. The tests below hold about 30 runs of 5 distinct configurations (0.7 CPU s each, two figures
    included); a run is deterministic, so each test gets a copy of its configuration's folder instead of a new
    run of the same inputs (the gate reads only the folders)."""
    folder = tmp_path_factory.mktemp("served")
    trace = requests_file(folder / "t.parquet", ARRIVALS, PROMPTS, OUTPUTS)
    made = {}

    def get(step: float, scheduler: str):
        if (step, scheduler) not in made:
            out = folder / f"{scheduler}-{len(made)}"
            made[step, scheduler] = stepsim.serve(MODEL, trace, iteration_latency=step, scheduler=scheduler,
                                                  out=out), out
        return made[step, scheduler]
    return get


@pytest.fixture
def runs(tmp_path, served):
    """``run(folder, step seconds, scheduler)``: a serve run of the same 4 requests into ``tmp_path/folder`` (the
    module's run of that configuration, copied; an earlier folder of that name replaced, as a new run would), and
    the requests file in ``tmp_path`` (byte for byte the one the runs read: its hash is in their records)."""
    requests_file(tmp_path / "t.parquet", ARRIVALS, PROMPTS, OUTPUTS)

    def run(folder, step=T, scheduler="vllm"):
        result, made = served(step, scheduler)
        target = tmp_path / folder
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(made, target)
        return result
    return run


def _cli(capsys, *argv):
    status = main(["compare", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def test_p99_ttft_worse_by_more_than_the_threshold_exits_1(runs, tmp_path, capsys):
    base, cand = runs("base", T), runs("cand", 1.25 * T)
    assert (base.summary["ttft_s"]["p99"], cand.summary["ttft_s"]["p99"]) == (0.026706249999999997, 0.038307812499999996)
    for threshold in ("5%", "0.05"):
        assert _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99", "--threshold",
                    threshold) == (1, [f"{VLLM}  (differs: iteration_latency 0.015625 -> 0.01953125)",
                                       "  ttft_s.p99                        0.02671 ->          0.03831  "
                                             "+43.44 %  WORSE", "worse by more than 5 %: ttft_s.p99"], "")
    # the same change under a threshold it does not reach
    assert _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99", "--threshold", "50%")[::2] \
        == (0, "")
    assert _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99", "--threshold",
                "50%")[1][-1] == "no metric worse by more than 50 %"


def test_default_metrics_and_a_better_candidate_exit_0(runs, tmp_path, capsys):
    runs("base", T)
    runs("cand", 0.75 * T)
    status, out, err = _cli(capsys, tmp_path / "base", tmp_path / "cand")
    assert (status, err) == (0, "")
    assert out == [f"{VLLM}  (differs: iteration_latency 0.015625 -> 0.01171875)",
                   "  ttft_s.p99                        0.02671 ->           0.0151  -43.44 %",
                   "  tpot_s.p99                        0.01563 ->          0.01172  -25.00 %",
                   "  e2e_s.p99                          0.1345 ->          0.09603  -28.61 %",
                   "  throughput_tokens_per_s             33.88 ->            34.39  +1.49 %",
                   "no metric worse by more than 1 %"]
    res = compare(tmp_path / "base", tmp_path / "cand")
    assert [c["metric"] for c in res["pairs"][0]["changes"]] == ["ttft_s.p99", "tpot_s.p99", "e2e_s.p99",
                                                                "throughput_tokens_per_s"]
    assert res["regressed"] is False and res["worse"] == []


def test_a_lower_throughput_is_worse(runs, tmp_path, capsys):
    runs("base", T)
    runs("cand", 1.25 * T)
    status, out, _ = _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "throughput_tokens_per_s",
                          "--metric", "slo_attainment", "--threshold", "1%")
    assert status == 1
    # * slo_attainment asked for by name but absent (no --slo) passed as "-": now it fails the gate, named
    assert out[1:] == ["  throughput_tokens_per_s             33.88 ->            33.39  -1.45 %  WORSE",
                       "  slo_attainment                          - ->                -  -  INVALID (missing)",
                       "worse by more than 1 %: throughput_tokens_per_s; candidate metric slo_attainment is missing "
                       f"in {VLLM.replace('0.015625', '0.01953125')}"]


def _summary_edit(folder, edit):
    path = folder / "summary.json"
    summary = json.loads(path.read_text())
    edit(summary)
    path.write_text(json.dumps(summary))  # Python writes NaN as the bare word NaN, as a careless tool would


CANDIDATE_CASES = [  # (edit of the candidate's summary, compare flags, exit status, last line); * each exited 0
    (lambda s: s["ttft_s"].update(p99=float("nan")), [], 1,
     "candidate metric ttft_s.p99 is NaN in {cand}"),  # *
    (lambda s: s["ttft_s"].update(p99=None), [], 1, "candidate metric ttft_s.p99 is missing in {cand}"),  # *
    (lambda s: s.update(throughput_tokens_per_s=float("inf")), [], 1,
     "candidate metric throughput_tokens_per_s is inf in {cand}"),  # *
    (lambda s: None, ["--metric", "slo_attainment"], 1,
     "candidate metric slo_attainment is missing in {cand}"),  # * neither run has --slo: asked for, so it fails
    (lambda s: s["ttft_s"].update(p99=0.02), [], 0, "no metric worse by more than 1 %"),  # a better value passes
]


def test_a_baseline_with_a_nan_metric_fails_the_gate(runs, tmp_path, capsys):
    runs("base", T)
    runs("cand", T)
    _summary_edit(tmp_path / "base", lambda s: s["tpot_s"].update(p99=float("nan")))  # * the gate was off: exit 0
    got, out, err = _cli(capsys, tmp_path / "base", tmp_path / "cand")
    assert (got, out[2], out[-1], err) == (
        1, "  tpot_s.p99                              - ->          0.01563  -  INVALID (baseline NaN)",
        f"baseline metric tpot_s.p99 is NaN in {VLLM}", "")


@pytest.mark.parametrize("edit, flags, status, last", CANDIDATE_CASES, ids=range(len(CANDIDATE_CASES)))
def test_a_candidate_with_an_unusable_metric_fails_the_gate(runs, tmp_path, capsys, edit, flags, status, last):
    runs("base", T)
    runs("cand", T)
    _summary_edit(tmp_path / "cand", edit)
    got, out, err = _cli(capsys, tmp_path / "base", tmp_path / "cand", *flags)
    assert (got, out[-1], err) == (status, last.format(cand=VLLM), "")
    res = compare(tmp_path / "base", tmp_path / "cand", metrics=flags[1:] or None)
    json.dumps(res, allow_nan=False)  # the JSON form holds no NaN: an unusable value reads as null
    assert res["regressed"] is bool(status)


def test_a_run_present_twice_in_the_baseline_is_a_duplicate_not_missing(runs, tmp_path, capsys):
    runs("base/a", T)
    runs("base/b", T)  # the same configuration twice
    runs("cand/a", T)
    status, out, err = _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99")
    # * was "missing in the candidate: ..." and "1 of 2 baseline configuration(s) missing", exit 1
    assert (status, err) == (0, "")
    assert out == [VLLM, "  ttft_s.p99                        0.02671 ->          0.02671  +0.00 %",
                   VLLM, "  ttft_s.p99                        0.02671 ->          0.02671  +0.00 %",
                   f"duplicate in the baseline: {VLLM} (recorded more than once)",
                   "no metric worse by more than 1 %"]
    res = compare(tmp_path / "base", tmp_path / "cand")
    assert (res["missing"], res["duplicates"]) == ([], [{"side": "baseline", "config": VLLM}])
    # each baseline record is held against the candidate's: a worse candidate fails against both
    runs("cand/a", 1.25 * T)
    status, out, _ = _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99")
    assert (status, out[-2:]) == (1, [f"duplicate in the baseline: {VLLM} (recorded more than once)",
                                      "worse by more than 1 %: ttft_s.p99"])


def test_folders_of_runs_pair_by_configuration_and_missing_ones_fail_unless_allowed(runs, tmp_path, capsys):
    runs("base/vllm", T)
    runs("base/orca", T, "orca")
    runs("cand/vllm", T)
    why = f"missing in the candidate: {ORCA}: closest candidate record differs in scheduler orca -> vllm, " \
          "max_num_batched_tokens None -> 2048"
    status, out, _ = _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99")
    assert (status, out) == (1, [VLLM, "  ttft_s.p99                        0.02671 ->          0.02671  +0.00 %",
                                 why, "1 of 2 baseline configuration(s) missing in the candidate (pass "
                                      "--allow-missing to accept)"])
    status, out, _ = _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99", "--allow-missing")
    assert (status, out[-2:]) == (0, [why, "1 of 2 baseline configuration(s) missing in the candidate (allowed by "
                                           "--allow-missing)"])
    # a candidate run of the orca configuration that is worse fails the gate by its metric only
    runs("cand/orca", 1.25 * T, "orca")
    status, out, _ = _cli(capsys, tmp_path / "base", tmp_path / "cand", "--metric", "ttft_s.p99")
    assert (status, out[-1]) == (1, "worse by more than 1 %: ttft_s.p99")
    assert [line for line in out if not line.startswith("  ")] == [
        f"{ORCA}  (differs: iteration_latency 0.015625 -> 0.01953125)", VLLM, out[-1]]


@pytest.mark.parametrize("extra, message", [
    (["--threshold", "nan"], "--threshold must be a finite ratio >= 0 (0.01 = 1 %), got nan"),
    (["--threshold", "inf%"], "--threshold must be a finite ratio >= 0 (0.01 = 1 %), got inf"),
    (["--threshold=-5%"], "--threshold must be a finite ratio >= 0 (0.01 = 1 %), got -0.05"),
    (["--metric", "ttft_s.p42"], "--metric ttft_s.p42: not a column of the baseline's records"),
    (["--metric", "model"], "--metric model: not a numeric column (the baseline holds 'qwen3-30b-a3b'); compare "
                            "latencies (ttft_s.p99 ...), throughputs or goodput"),
])
def test_refusals_are_one_line_with_their_reason(runs, tmp_path, capsys, extra, message):
    runs("base", T)
    runs("cand", T)
    assert _cli(capsys, tmp_path / "base", tmp_path / "cand", *extra) == (2, [], f"stepsim: error: {message}\n")


def test_serve_runs_are_not_compared_with_run_records(runs, tmp_path, capsys):
    runs("base", T)
    assert main(["run", "swiglu", "--out", str(tmp_path / "rec")]) == 0
    capsys.readouterr()
    assert _cli(capsys, tmp_path / "base", tmp_path / "rec") == (
        2, [], f"stepsim: error: {tmp_path / 'base'} holds serve runs and {tmp_path / 'rec'} run records: compare "
               "like with like\n")


def test_serve_record_reads_the_folder_back(runs, tmp_path):
    r = runs("base", T)
    row = read_serve_folder(tmp_path / "base")
    summary = json.loads((tmp_path / "base" / "summary.json").read_text())
    assert row["ttft_s.p99"] == summary["ttft_s"]["p99"] == r.summary["ttft_s"]["p99"]
    assert (row["record"], row["requests_file"], row["seed"], row["scheduler"], row["completed"]) == (
        "serve", "t.parquet", 0, "vllm", 4)
    from stepsim.base.files import file_sha256

    assert row["requests_sha256"] == file_sha256(tmp_path / "t.parquet")
