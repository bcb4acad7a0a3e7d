"""Serving sweeps (``workload = "serve"`` in ``stepsim sweep``): rows carry the serve summary, local and Dask
executors write the same rows, a re-run resumes, the run id follows every knob and file content, bad files are
one line, and ``stepsim compare`` gates two sweep folders."""

from __future__ import annotations

import shutil

import pytest
from serve_requests import requests_file

import stepsim
from stepsim.cli import main
from stepsim.serve import api as serve_api
from stepsim.serve import scheduler as scheduler_module
from stepsim.serve.sweep import (
    config_of,
    load_serve_sweep,
    read_serve_sweep,
    run_identity,
    run_serve_sweep,
    with_defaults,
)

T = 2.0**-6  # binary-exact step time (s)
SWEEP = """
workload = "serve"
out = "{out}"
[fixed]
model = "qwen3-30b-a3b"
requests = "t.parquet"
iteration_latency = {step}
slo = "ttft=30ms,tpot=20ms"
[axes]
scheduler = ["vllm", "orca", "sarathi"]
max_seqs = [1, 4]
"""
#: columns that measure wall time (differ between two runs of one task)
WALL = ("task_wall_s", "wall_s")


@pytest.fixture
def sweep(tmp_path):
    """``sweep(out, step)``: a serving sweep file over 6 requests in ``tmp_path``, returning its path."""
    requests_file(tmp_path / "t.parquet", [0.0, 0.01, 0.02, 0.5, 0.6, 0.61], [100, 20, 300, 50, 70, 900],
                  [5, 3, 8, 2, 40, 9])

    def make(out="out", step=T, name="s.toml"):
        (tmp_path / name).write_text(SWEEP.format(out=out, step=step))
        return tmp_path / name
    return make


def _rows(folder):
    return [{k: v for k, v in r.items() if k not in WALL} for r in read_serve_sweep(folder).to_pylist()]


def test_rows_are_the_serve_summaries_of_each_grid_point(sweep, tmp_path):
    report = run_serve_sweep(load_serve_sweep(sweep()), jobs=1)
    assert (report.total, len(report.ran), report.skipped, report.failed) == (6, 6, [], [])
    rows = read_serve_sweep(tmp_path / "out").to_pylist()
    assert sorted((config_of(r)["scheduler"], config_of(r)["max_seqs"]) for r in rows) == [
        ("orca", 1), ("orca", 4), ("sarathi", 1), ("sarathi", 4), ("vllm", 1), ("vllm", 4)]
    for row in rows:
        config = config_of(row)
        assert config["requests"] == (tmp_path / "t.parquet").as_posix()  # resolved against the sweep file
        direct = stepsim.serve(**config).summary
        assert row["status"] == "ok" and row["record"] == "serve"
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            assert [row[f"{key}.{s}"] for s in ("mean", "p50", "p90", "p99")] == [
                direct[key][s] for s in ("mean", "p50", "p90", "p99")]
        for key in ("throughput_tokens_per_s", "throughput_requests_per_s", "slo_attainment",
                    "goodput_requests_per_s", "completed", "preemptions", "iterations"):
            assert row[key] == direct[key]
        assert (row["scheduler"], row["max_num_seqs"], row["iteration_latency"]) == (
            config["scheduler"], config["max_seqs"], T)
    vllm4 = next(r for r in rows if config_of(r) == {**config_of(r), "scheduler": "vllm", "max_seqs": 4})
    assert (vllm4["ttft_s.p50"], vllm4["ttft_s.p99"], vllm4["completed"]) == (0.018437499999999996, 0.02659375, 6)


def test_dask_writes_the_rows_of_the_local_pool(sweep, tmp_path):
    pytest.importorskip("distributed")
    from stepsim.batch.dask_executor import DaskExecutor

    run_serve_sweep(load_serve_sweep(sweep()), jobs=1)
    with DaskExecutor(jobs=2, processes=False) as executor:
        report = run_serve_sweep(load_serve_sweep(sweep()), out=tmp_path / "dask", executor=executor)
    assert report.executor == "dask (local cluster), 2 worker threads" and len(report.ran) == 6
    assert sorted(p.name for p in (tmp_path / "dask").iterdir()) == sorted(p.name for p in (tmp_path / "out").iterdir())
    assert _rows(tmp_path / "dask") == _rows(tmp_path / "out")


def test_a_rerun_resumes_and_retries_failed_tasks_only_when_asked(sweep, tmp_path, capsys):
    path = sweep()
    assert main(["sweep", str(path), "--jobs", "1"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[0] == f"serving sweep -> {tmp_path / 'out'}: 6 task(s), 6 run, 0 already done, 0 failed (local, 1 worker)"
    assert first[1:4] == ["  scheduler  max_seqs  TTFT p50 ms  TTFT p99 ms  TPOT p50 ms  TPOT p99 ms  tokens/s  goodput req/s",
                          "       vllm         1         49.7        605.1         15.6         15.6      49.1          2.197",
                          "       vllm         4         18.4         26.6         15.6         15.6      54.7          4.898"]
    files = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    victim = sorted(files)[2]
    (tmp_path / "out" / victim).unlink()
    assert main(["sweep", str(path), "--jobs", "1"]) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[0] == f"serving sweep -> {tmp_path / 'out'}: 6 task(s), 1 run, 5 already done, 0 failed (local, 1 worker)"
    assert again[1:] == first[1:]
    assert {p.name for p in (tmp_path / "out").iterdir()} == set(files)
    assert all((tmp_path / "out" / n).read_bytes() == b for n, b in files.items() if n != victim)  # untouched


def test_a_task_that_fails_is_a_row_and_exit_status_1(sweep, tmp_path, capsys):
    path = sweep()
    text = path.read_text().replace('max_seqs = [1, 4]', 'max_seqs = [1, 4]\nhbm_bytes = [60_000_000_000, 68_719_476_736]')
    path.write_text(text.replace('scheduler = ["vllm", "orca", "sarathi"]', 'scheduler = ["vllm"]'))
    assert main(["sweep", str(path), "--jobs", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"serving sweep -> {tmp_path / 'out'}: 4 task(s), 4 run, 0 already done, 2 failed (local, 1 worker)"
    assert out[2] == ("       vllm         1  60000000000  failed: ConfigError: the model's weights (61.06 GB) do not "
                      "fit in HBM (60.00 GB): 1.06 GB short; serve it on several chips with --system FILE")
    failed = [r for r in read_serve_sweep(tmp_path / "out").to_pylist() if r["status"] == "failed"]
    assert [(r["error_type"], config_of(r)["hbm_bytes"], r["ttft_s.p99"]) for r in failed] == [
        ("ConfigError", 60_000_000_000, None)] * 2
    # a re-run counts failed rows as done; --retry-failed runs them again
    assert main(["sweep", str(path)]) == 1
    assert capsys.readouterr().out.splitlines()[0].endswith("4 task(s), 0 run, 4 already done, 2 failed")
    assert main(["sweep", str(path), "--retry-failed", "--jobs", "1"]) == 1
    assert capsys.readouterr().out.splitlines()[0].endswith("4 task(s), 2 run, 2 already done, 2 failed "
                                                             "(local, 1 worker)")


def test_run_identity_follows_every_knob_and_the_files_content_not_their_path(sweep, tmp_path):
    sweep()
    src = tmp_path / "s.toml"
    config = {"model": "qwen3-30b-a3b", "requests": str(tmp_path / "t.parquet"), "iteration_latency": T}
    shutil.copy(tmp_path / "t.parquet", tmp_path / "copy.parquet")
    base = run_identity(config, source=src)
    assert run_identity({**config, "requests": str(tmp_path / "copy.parquet")}, source=src) == base
    assert run_identity({**config, "iteration_latency": 2 * T}, source=src) != base
    assert run_identity({**config, "seed": 1}, source=src) != base
    requests_file(tmp_path / "copy.parquet", [0.0], [1], [1])
    assert run_identity({**config, "requests": str(tmp_path / "copy.parquet")}, source=src) != base
    assert len(base) == 64


@pytest.mark.parametrize("edit, message", [
    (("max_seqs = [1, 4]", "max_seq = [1, 4]"), "{f}: unknown key 'max_seq' in [axes] (did you mean 'max_seqs'?); "
                                                "known keys: model, requests, arrival_scale, arrival, limit_requests, "
                                                "duration, hardware, scheduler, max_seqs, max_batch_tokens, "
                                                "chunk_tokens, routing, fidelity, slo, seed, iteration_latency, "
                                                "hbm_bytes, block_size, drop_long, truncate_long, schedule"),
    (("max_seqs = [1, 4]", "max_seqs = [1, 4.5]"), "{f} (task scheduler=vllm max_seqs=4.5): max_seqs must be an "
                                                   "integer, got 4.5"),
    (('"orca", ', '"orcaa", '), "{f} (task scheduler=orcaa max_seqs=1): scheduler must be one of vllm, sarathi, "
                                "orca, got 'orcaa'"),
    (("ttft=30ms", "ttft=30"), "{f} (task scheduler=vllm max_seqs=1): --slo 'ttft=30,tpot=20ms': cannot parse "
                               "'ttft=30'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, e.g. "
                               "ttft=2s,tpot=200ms"),
    (('requests = "t.parquet"', 'requests = "none.parquet"'), "{f}: requests {d}/none.parquet: cannot read "
                                                              "(No such file or directory)"),
    (('requests = "t.parquet"', ''), "{f}: 'requests' is needed in [fixed] or in every [axes] table"),
])
def test_bad_sweep_files_are_one_line_before_any_task_runs(sweep, tmp_path, capsys, edit, message):
    path = sweep()
    path.write_text(path.read_text().replace(*edit))
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == "stepsim: error: " + message.format(f=path, d=tmp_path.as_posix()) + "\n"
    assert not (tmp_path / "out").exists()


def test_dry_run_lists_the_tasks(sweep, tmp_path, capsys):
    path = sweep()
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [f"sweep {path} -> {tmp_path / 'out'}", "  tasks      6 grid point(s) in 1 grid(s); serving",
                       "  first 6 task(s):"]
    assert [line.split()[2:] for line in out[3:]] == [[f"scheduler={s}", f"max_seqs={m}"]
                                                      for s in ("vllm", "orca", "sarathi") for m in (1, 4)]
    assert not (tmp_path / "out").exists()


def test_compare_gates_two_serving_sweeps(sweep, tmp_path, capsys):
    assert main(["sweep", str(sweep()), "--jobs", "1"]) == 0
    assert main(["sweep", str(sweep(out="slow", step=1.25 * T, name="slow.toml")), "--jobs", "1"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "out"), str(tmp_path / "slow"), "--metric", "ttft_s.p99",
                 "--threshold", "5%"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 13 and out[-1] == "worse by more than 5 %: ttft_s.p99"
    assert all(line.endswith("(differs: iteration_latency 0.015625 -> 0.01953125)") for line in out[0:12:2])
    # a candidate sweep with fewer grid points: the missing configurations fail the gate unless allowed
    for p in sorted((tmp_path / "slow").glob("part-*.parquet"))[:2]:
        p.unlink()
    assert main(["compare", str(tmp_path / "out"), str(tmp_path / "slow"), "--metric", "ttft_s.p99",
                 "--threshold", "50%"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == ("2 of 6 baseline configuration(s) missing in the candidate "
                                                        "(pass --allow-missing to accept)")
    assert main(["compare", str(tmp_path / "out"), str(tmp_path / "slow"), "--metric", "ttft_s.p99",
                 "--threshold", "50%", "--allow-missing"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("2 of 6 baseline configuration(s) missing in the candidate "
                                                        "(allowed by --allow-missing)")


def test_a_changed_request_file_replaces_the_rows_of_its_tasks(sweep, tmp_path, capsys):
    path = sweep()
    assert main(["sweep", str(path), "--jobs", "1"]) == 0
    before = {r["run_id"] for r in read_serve_sweep(tmp_path / "out").to_pylist()}
    # another grid's row in the same folder stays
    (tmp_path / "other.toml").write_text(SWEEP.format(out="out", step=T).replace('max_seqs = [1, 4]',
                                                                                 'max_seqs = [2]'))
    assert main(["sweep", str(tmp_path / "other.toml"), "--jobs", "1"]) == 0
    requests_file(tmp_path / "t.parquet", [0.0, 0.01], [100, 20], [5, 3])  # new content, same path
    capsys.readouterr()
    assert main(["sweep", str(path), "--jobs", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"serving sweep -> {tmp_path / 'out'}: 6 task(s), 6 run, 0 already done, 0 failed, 6 older row(s) replaced "
        "(local, 1 worker)")
    rows = read_serve_sweep(tmp_path / "out").to_pylist()
    assert len(rows) == 9 and not before & {r["run_id"] for r in rows}
    assert sorted(r["requests"] for r in rows if config_of(r)["max_seqs"] != 2) == [2] * 6
    assert sorted(r["requests"] for r in rows if config_of(r)["max_seqs"] == 2) == [6] * 3  # the other grid's


def test_a_folder_another_sweep_holds_is_refused(sweep, tmp_path, capsys):
    from stepsim.batch.runner import LOCK_NAME, exclusive

    path = sweep()
    (tmp_path / "out").mkdir()
    with exclusive(tmp_path / "out"):
        assert main(["sweep", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"stepsim: error: another stepsim sweep is writing into {tmp_path / 'out'} "
                                       f"(lock {tmp_path / 'out' / LOCK_NAME} is held); wait for it to finish or "
                                       "choose another output folder\n")
    assert list((tmp_path / "out").glob("part-*")) == []
    assert main(["sweep", str(path), "--no-progress", "--jobs", "1"]) == 0  # released


def test_fail_fast_and_force_are_refused_for_a_serving_sweep(sweep, tmp_path, capsys):
    assert main(["sweep", str(sweep()), "--fail-fast"]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --fail-fast is not supported by serving sweeps (every task "
                                       "runs; failures are rows)\n")
    assert main(["sweep", str(sweep()), "--force"]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --force lifts the run-size limit of workload sweeps; a "
                                       "serving sweep has none\n")
    assert not (tmp_path / "out").exists()


def test_a_default_spelled_out_is_the_same_run_id_and_a_changed_default_another(sweep, tmp_path, monkeypatch):
    sweep()
    src = tmp_path / "s.toml"
    config = {"model": "qwen3-30b-a3b", "requests": str(tmp_path / "t.parquet"), "iteration_latency": T}
    base = run_identity(config, source=src)
    spelled = {"scheduler": "vllm", "seed": 0, "block_size": 16, "hardware": "sn40l", "max_seqs": 128,
               "max_batch_tokens": 2048, "chunk_tokens": 0}
    for key, value in spelled.items():
        assert run_identity({**config, key: value}, source=src) == base, key
    assert run_identity({**config, **spelled}, source=src) == base
    assert run_identity({**config, "max_seqs": 64}, source=src) != base
    # per policy: sarathi's chunk defaults to 512, orca has none
    sarathi = run_identity({**config, "scheduler": "sarathi"}, source=src)
    assert run_identity({**config, "scheduler": "sarathi", "chunk_tokens": 512}, source=src) == sarathi
    assert run_identity({**config, "scheduler": "sarathi", "chunk_tokens": 256}, source=src) != sarathi
    assert run_identity({**config, "scheduler": "orca", "max_seqs": 128}, source=src) == run_identity(
        {**config, "scheduler": "orca"}, source=src)
    # an engine-backed run of an MoE model routes synthetically unless told otherwise
    fast = {**config, "fidelity": "fast"}
    del fast["iteration_latency"]
    assert run_identity({**fast, "routing": "synthetic"}, source=src) == run_identity(fast, source=src)
    # and builds its layers mapped on sn40l unless told (serve's default): a paper run's rows are not reused
    assert run_identity({**fast, "schedule": "auto"}, source=src) == run_identity(fast, source=src) != \
        run_identity({**fast, "schedule": "paper"}, source=src)
    assert "schedule" not in with_defaults(config)  # --iteration-latency builds no layer: its ids are as they were
    # a changed default changes the id of a task that relied on it, not of one that spelled the value
    monkeypatch.setattr(scheduler_module, "VLLM_MAX_SEQS", 64)
    assert run_identity(config, source=src) == run_identity({**config, "max_seqs": 64}, source=src) != base
    assert run_identity({**config, "max_seqs": 128}, source=src) == base
    monkeypatch.setitem(serve_api.serve.__kwdefaults__, "seed", 1)  # stepsim.serve's signature
    assert run_identity({**config, "max_seqs": 128}, source=src) == run_identity(
        {**config, "max_seqs": 128, "seed": 1}, source=src) != base


def test_a_rerun_spelling_the_defaults_reuses_the_rows(sweep, tmp_path, capsys):
    path = sweep()
    assert main(["sweep", str(path), "--jobs", "1"]) == 0
    capsys.readouterr()
    files = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    text = path.read_text().replace("[axes]", "seed = 0\nblock_size = 16\nhardware = \"sn40l\"\n[axes]")
    path.write_text(text)
    assert main(["sweep", str(path), "--jobs", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"serving sweep -> {tmp_path / 'out'}: 6 task(s), 0 run, 6 already done, 0 failed")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == files
