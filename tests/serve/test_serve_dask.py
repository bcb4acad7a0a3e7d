"""``--executor dask``: the layers of each step on a dask.distributed cluster give the bytes of ``--jobs 1``."""

from __future__ import annotations

import json

import pytest
from serve_requests import requests_file
from test_exact import SMALL

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.serve.output import read_outputs

get_task_stream = pytest.importorskip("distributed").get_task_stream

FILES = ("requests.parquet", "iterations.parquet")


@pytest.fixture
def small(tmp_path):
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0005, 0.001, 0.02], [40, 300, 7, 90], [6, 3, 9, 4])
    return str(tmp_path / "small.json"), trace


@pytest.fixture(scope="module")
def one_job(tmp_path_factory):
    """``(model, trace, result, folder)``: the small model's exact run of :func:`small`'s 4 requests in this process
    (one job), made once for the module: the reference both the thread-worker and the running-scheduler tests
    compare their Dask runs of the same model and requests with (each made it again before)."""
    folder = tmp_path_factory.mktemp("one_job")
    (folder / "small.json").write_text(json.dumps(SMALL))
    trace = requests_file(folder / "t.parquet", [0.0, 0.0005, 0.001, 0.02], [40, 300, 7, 90], [6, 3, 9, 4])
    model = str(folder / "small.json")
    one = stepsim.serve(model, trace, fidelity="exact", schedule="paper", out=folder / "one")
    return model, trace, one, folder / "one"


def _same_run(a, b) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    sa, sb = read_outputs(a)[2], read_outputs(b)[2]
    sa.pop("wall_s"), sb.pop("wall_s")
    assert sa == sb


def test_exact_on_two_dask_thread_workers_is_byte_identical_to_one_job(one_job, tmp_path):
    from stepsim.batch.dask_executor import DaskExecutor

    model, trace, one, one_folder = one_job
    # two threads of this process on the loopback interface (each thread keeps its own templates)
    with DaskExecutor(jobs=2, warm_kernels=True, processes=False) as executor, \
            get_task_stream(client=executor.client) as stream:
        dask = stepsim.serve(model, trace, fidelity="exact", schedule="paper", executor=executor, out=tmp_path / "dask")
        assert executor.client.status == "running"  # a given executor is the caller's: not closed
    _same_run(one_folder, tmp_path / "dask")
    it = one.iterations
    # per step: decode and prefill attention (when present) and both layers' FFN, every one on the engine
    pieces = 4 * it.num_rows - it["prefill_tokens"].to_pylist().count(0) - it["decode_tokens"].to_pylist().count(0)
    assert dask.summary["fidelity"]["simulations"] == one.summary["fidelity"]["simulations"] == pieces == 66
    # one Dask task per worker and step (each step has at least 3 pieces: attention and the two layers' FFN)
    assert len(stream.data) == 2 * it.num_rows and {t["key"].split("-")[0] for t in stream.data} == {"layer_tasks"}


@pytest.mark.slow
def test_cli_executor_dask_starts_a_local_cluster_and_writes_the_bytes_of_jobs_1(small, tmp_path, capsys):
    model, trace = small
    base = ["serve", "--model", model, "--requests", str(trace), "--fidelity", "exact", "--schedule", "paper"]
    assert main([*base, "--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    assert main([*base, "--executor", "dask", "--out", str(tmp_path / "dask")]) == 0
    _same_run(tmp_path / "one", tmp_path / "dask")


@pytest.mark.parametrize("kw, message", [
    (dict(jobs=2, executor="dask"), "--jobs and --executor both run the layers; give one"),
    (dict(executor="ray"), "--executor must be dask, got 'ray'"),
    (dict(address="tcp://127.0.0.1:1"), "--address is only for --executor dask"),
])
def test_bad_executor_settings_are_one_line(small, kw, message):
    model, trace = small
    with pytest.raises(ConfigError) as e:
        stepsim.serve(model, trace, fidelity="exact", schedule="paper", **kw)
    assert str(e.value) == message


def test_address_connects_to_a_running_scheduler(one_job, tmp_path):
    from distributed import LocalCluster

    model, trace, _, one_folder = one_job
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", protocol="tcp://",
                      dashboard_address=None) as cluster:
        stepsim.serve(model, trace, fidelity="exact", schedule="paper", executor="dask", address=cluster.scheduler_address,
                      out=tmp_path / "remote")
        assert len(cluster.scheduler.workers) == 1  # the cluster is the caller's: still up
    _same_run(one_folder, tmp_path / "remote")


def test_fast_calibrates_on_dask_to_the_bytes_of_one_job(small, tmp_path):
    import numpy as np

    from stepsim.batch.dask_executor import DaskExecutor

    model, _ = small
    rng = np.random.default_rng(3)  # tests/serve/test_fast.py's trace: 24 requests, enough steps to hold 12 out
    trace = requests_file(tmp_path / "f.parquet", np.sort(rng.uniform(0, 0.05, 24)), rng.integers(5, 400, 24),
                          rng.integers(2, 30, 24))
    stepsim.serve(model, trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "c1", out=tmp_path / "one")
    with DaskExecutor(jobs=2, warm_kernels=True, processes=False) as executor, \
            get_task_stream(client=executor.client) as stream:
        dask = stepsim.serve(model, trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "c2", executor=executor,
                             out=tmp_path / "dask")
    _same_run(tmp_path / "one", tmp_path / "dask")
    error = dask.summary["fidelity"]["error"]
    # every exact simulation of the calibration ran on the cluster, two Dask tasks at a time: the first pass's
    # fitted pieces, the second pass's, then each of the 12 held-out steps whole
    assert error["held_out_iterations"] == 12 and error["calibration_simulations"] > 2
    assert len(stream.data) == 2 + 2 + 2 * 12
