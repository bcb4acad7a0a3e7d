"""stepsim plan's tasks on the sweep runner's executors (stepsim/plan/waves.py, docs/plan.md §4 "Waves"): on the
planning test case of test_plan.py (its small MoE model, 12 requests, 12 deployments up to 4 chips, the stored
calibrations), two local worker processes and a Dask cluster write the bytes of the in-process plan; a plan stopped
after some of its deployment tasks resumes and runs only the others, to the same files; a changed SLO or trace
runs every task again; the command line takes --jobs and --executor dask."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from calibration_seeding import check_seed_used, seeded_cache
from test_plan import SLO, SPACE, write_case

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.plan.waves import WORK_FOLDER, PlanTaskError


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The model, trace and keyword arguments of test_plan.py's case, and its plan made in this process."""
    tmp = tmp_path_factory.mktemp("waves")
    model, trace = write_case(tmp)
    kw = dict(slo=SLO, max_chips=4, space=SPACE, calibration_cache=seeded_cache(tmp / "cache"), verify=False)
    here = stepsim.plan(str(model), trace, out=tmp / "here", **kw)
    check_seed_used(tmp / "cache")
    return str(model), trace, kw, here, tmp


def _same_files(a, b):
    """plan.json equal but for the wall time and the folder the commands name; deployments.parquet byte for byte."""
    sa, sb = (json.loads((d / "plan.json").read_text()) for d in (a, b))
    for s, d in ((sa, a), (sb, b)):
        s.pop("wall_s"), s.pop("phase_wall_s"), s.pop("phase_task_s")
        s["commands"] = [c.replace(str(d), "OUT") for c in s["commands"]]
    assert sa == sb
    assert (a / "deployments.parquet").read_bytes() == (b / "deployments.parquet").read_bytes()
    # the tasks' rows in the work folders: the same task ids, byte for byte
    rows_a, rows_b = (sorted((d / WORK_FOLDER).glob("part-*.parquet")) for d in (a, b))
    assert [p.name for p in rows_a] == [p.name for p in rows_b] and rows_a
    assert [p.read_bytes() for p in rows_a] == [p.read_bytes() for p in rows_b]


@pytest.mark.slow  # about 45 s at load 4: each worker process prices its replays' token counts afresh
def test_two_local_workers_write_the_in_process_plan(case, monkeypatch):
    from stepsim.plan.waves import WaveRunner

    model, trace, kw, here, tmp = case
    calls = []  # (method, tasks) as the parent calls them: the offered runs start between the waves' parts
    for name in ("start", "search"):
        monkeypatch.setattr(WaveRunner, name, lambda self, configs, method=getattr(WaveRunner, name), name=name: (
            calls.append((name, len(configs))), method(self, configs))[1])
    two = stepsim.plan(model, trace, out=tmp / "two", jobs=2, **kw)
    searches = [i for i, (name, n) in enumerate(calls) if name == "search" and n]
    assert any(name == "start" and n for name, n in calls[:searches[-1]])  # before the last wave's last part
    assert (two.work["ran"], two.work["skipped"], two.work["executor"]) == (12, 0, "local, 2 workers")
    assert (here.work["ran"], here.work["executor"]) == (12, "this process")
    _same_files(tmp / "here", tmp / "two")
    # every deployment has its row in the work folder: one task each, none pruned before its wave on this case
    assert len(list((tmp / "two" / WORK_FOLDER).glob("part-*.parquet"))) == 12
    print("wall in process", here.summary["wall_s"], "two workers", two.summary["wall_s"])


def test_a_dask_cluster_writes_the_in_process_plan(case):
    pytest.importorskip("distributed")
    from stepsim.batch.dask_executor import DaskExecutor

    model, trace, kw, _, tmp = case
    # two worker threads of this process on the loopback interface (as tests/serve/test_serve_sweep.py makes one)
    with DaskExecutor(jobs=2, warm_kernels=True, processes=False) as executor:
        dask = stepsim.plan(model, trace, out=tmp / "dask", executor=executor, **kw)
        assert executor.client.status == "running"  # a given executor is the caller's: not closed
    assert (dask.work["ran"], dask.work["executor"]) == (12, "dask (local cluster), 2 worker threads")
    _same_files(tmp / "here", tmp / "dask")


def test_an_interrupted_plan_resumes_with_the_unfinished_deployments(case, monkeypatch):
    import stepsim.plan.waves as waves

    model, trace, kw, here, tmp = case
    real = waves.run_deployment
    calls = []

    def stop_after_five(config):
        calls.append(config["deployment"])
        if len(calls) > 5:
            raise RuntimeError("interrupted")
        return real(config)

    monkeypatch.setattr(waves, "run_deployment", stop_after_five)
    with pytest.raises(PlanTaskError, match=r"^plan task 1x2ch sn40l none vllm seqs 4 batch 256 failed: RuntimeError: "
                                            r"interrupted\n"):
        stepsim.plan(model, trace, out=tmp / "stopped", **kw)
    assert not (tmp / "stopped" / "plan.json").exists()
    # the one-chip wave (3 tasks) and 2 of the two-chip wave's 3 searched deployments have their rows
    assert len(list((tmp / "stopped" / WORK_FOLDER).glob("part-*.parquet"))) == 5
    monkeypatch.setattr(waves, "run_deployment", real)
    again = stepsim.plan(model, trace, out=tmp / "stopped", **kw)
    assert (again.work["ran"], again.work["skipped"]) == (7, 5)
    _same_files(tmp / "here", tmp / "stopped")
    # the same plan once more reads every row back and runs nothing
    third = stepsim.plan(model, trace, out=tmp / "stopped", **kw)
    assert (third.work["ran"], third.work["skipped"]) == (0, 12)
    _same_files(tmp / "here", tmp / "stopped")


def test_a_changed_slo_runs_every_task_again(case):
    model, trace, kw, here, tmp = case
    out = tmp / "slo"
    stepsim.plan(model, trace, out=out, **kw)
    before = sorted(p.name for p in (out / WORK_FOLDER).glob("part-*.parquet"))
    changed = stepsim.plan(model, trace, out=out, **{**kw, "slo": "ttft=0.61ms,tpot=0.024ms"})
    after = sorted(p.name for p in (out / WORK_FOLDER).glob("part-*.parquet"))
    searched = sum(r["decided"] != "pruned" for r in changed.deployments)
    assert changed.work["skipped"] == 0 and changed.work["ran"] == searched == len(after)
    assert not set(before) & set(after)  # the earlier SLO's rows retired with the new plan


def test_the_task_id_hashes_the_trace_the_slo_and_the_calibrations():
    from stepsim.plan.evaluate import BaseTrace
    from stepsim.plan.search import DurationFloor
    from stepsim.plan.space import Deployment, SchedulerChoice
    from stepsim.plan.waves import deployment_config, task_id, trace_hash

    base = BaseTrace(np.array([0.0, 0.001]), np.array([10, 20]), np.array([2, 3]))
    moved = BaseTrace(np.array([0.0, 0.002]), np.array([10, 20]), np.array([2, 3]))
    dep = Deployment(1, 1, "none", SchedulerChoice("vllm", 4, 256))
    shape = {"sn40l x1": {"calibration": "abc"}}
    kw = dict(cache="/c", trace_sha256=trace_hash(base), shapes=shape, search_slo={"ttft": 1e-3}, percentile=99.0,
              prune=True, rate_bound=256.0, duration_floor=DurationFloor(((0.0, 1e-3),)), beat=-1.0, match=-1.0)
    one = task_id({**deployment_config("m", dep, **kw), "work": "/w"})
    assert task_id({**deployment_config("m", dep, **{**kw, "cache": "/d"}), "work": "/v"}) == one  # where files live
    for change in ({"trace_sha256": trace_hash(moved)}, {"search_slo": {"ttft": 1.1e-3}}, {"percentile": 90.0},
                   {"shapes": {"sn40l x1": {"calibration": "abd"}}}, {"beat": 5.0}, {"match": 5.0},
                   {"rate_bound": 100.0},
                   {"duration_floor": DurationFloor(((0.0, 2e-3),))}):
        assert task_id({**deployment_config("m", dep, **{**kw, **change}), "work": "/w"}) != one, change


def test_the_offered_runs_are_grouped_by_what_can_share_a_replica_run():
    """One offered task per group of front deployments that may share a replica's replay: the same hardware, replica
    chips, pools and scheduler, and round-robin replicas with a request set in common or a router that routes by
    state; each group in the front's order, the groups in the order of their first member."""
    from stepsim.plan.space import Deployment, SchedulerChoice
    from stepsim.plan.waves import offered_config, offered_groups

    vllm, orca = SchedulerChoice("vllm", 4, 256), SchedulerChoice("orca", 4, 0)
    deps = [Deployment(1, 1, "none", vllm), Deployment(1, 2, "round-robin", vllm), Deployment(2, 1, "none", vllm),
            Deployment(1, 4, "least-outstanding", vllm), Deployment(1, 1, "none", orca),
            Deployment(1, 2, "round-robin", orca), Deployment(2, 1, "none", vllm, "sn40l", (1, 1)),
            Deployment(2, 2, "round-robin", vllm, "sn40l", (1, 1))]
    # 12 requests: one replica's, two round-robin replicas' and the state-routed replicas' sets may meet in the vLLM
    # one-chip group (which the routing by state joins); two disaggregated replicas' halves never meet one's whole
    assert offered_groups(deps, 12) == [[0, 1, 3], [2], [4], [5], [6], [7]]
    assert offered_groups(deps[:2], 12) == [[0], [1]]  # round-robin halves and the whole: no request set in common
    # one request: two round-robin replicas send it to the first, as one replica does (the second gets none)
    assert offered_groups(deps[:2], 1) == [[0, 1]]
    assert offered_groups([], 12) == []
    config = offered_config("m", [deps[0], deps[3]], cache="/c", trace_sha256="t", shapes={}, search_slo={"ttft": 1.0},
                            percentile=99.0)
    assert [d["replicas"] for d in config["deployments"]] == [1, 4] and config["kind"] == "offered"


def test_the_offered_runs_start_once_no_deployment_left_can_join_or_change_their_group():
    """After each part of the waves, a group of the front's deployments (``offered_groups``) starts its offered run
    (``runner.start``, on CPU the later parts leave idle) once every member is final (no deployment left has at
    most its chips) and no deployment not searched yet may share a replica's replay with one of its members; each
    starts once, and the runs come back into their rows with their replays counted."""
    from types import SimpleNamespace

    from stepsim.plan.api import _collect_offered, _start_offered
    from stepsim.plan.space import Deployment, SchedulerChoice

    class Runner:  # what start() is given, and a run of one replay per deployment from collect()
        def __init__(self):
            self.started = []

        def start(self, configs):
            self.started += configs
            return list(range(len(self.started) - len(configs), len(self.started)))

        def collect(self, handles):
            runs = {"offered": None, "replays": 1, "replays_stopped": 0, "replays_reused": 0, "replays_unservable": 0}
            return [{"runs": [runs] * len(self.started[h]["deployments"])} for h in handles]

    vllm, orca = SchedulerChoice("vllm", 4, 256), SchedulerChoice("orca", 4, 0)
    one, halves = Deployment(1, 1, "none", vllm), Deployment(1, 2, "round-robin", vllm)
    by_state, rival = Deployment(1, 2, "least-outstanding", vllm), Deployment(1, 1, "none", orca)
    task = dict(cache="/c", trace_sha256="t", shapes={}, search_slo={"ttft": 1.0}, percentile=99.0)
    # the one-chip vLLM deployment on the front, one more deployment not searched yet
    for unsettled, n, now in (([halves], 12, True),  # halves of 12 requests never are the whole: it starts
                              ([halves], 1, False),  # one request: the first of two replicas serves it as one does
                              ([by_state], 12, False),  # routed by state: its replicas' sets are known once served
                              ([rival], 12, False)):  # a rival of its chips, which may take it off the front
        table = [{"index": i, "dep": d, "chips": d.chips, "goodput": g, "search": SimpleNamespace(offered=None)}
                 for i, (d, g) in enumerate(((one, 2.0), (unsettled[0], None)))]
        runner = Runner()
        started = _start_offered(table, unsettled, n, runner, "m", task)
        assert [[r["index"] for r in group] for group, _ in started] == ([[0]] if now else [])
        started += _start_offered(table, [], n, runner, "m", task)  # every search done: the rest, once
        assert [[r["index"] for r in group] for group, _ in started] == [[0]]
        assert [c["deployments"][0]["replicas"] for c in runner.started] == [1]
        assert _collect_offered(started, runner)["replays"] == 1 and table[0]["replays"] == 1
        assert "replays" not in table[1] and table[0]["search"].offered is None


@pytest.mark.slow  # a fork server starts
def test_offered_runs_routed_by_state_on_two_workers_write_the_in_process_plan(tmp_path):
    """A front with a least-outstanding deployment (its replicas' request sets known only once served) and
    round-robin ones of the same shape: one offered task for all, and on two workers the in-process files."""
    from stepsim.plan.space import Deployment, SchedulerChoice
    from stepsim.plan.waves import offered_groups

    model, trace = write_case(tmp_path)
    space = {"chips_per_replica": [1], "replicas": [1, 2, 3], "routers": ["round-robin", "least-outstanding"],
             "scheduler": [{"policy": "vllm", "max_seqs": [4], "max_batch_tokens": [256]}]}
    kw = dict(slo=SLO, max_chips=3, space=space, calibration_cache=seeded_cache(tmp_path / "cache"), verify=False)
    here = stepsim.plan(str(model), trace, out=tmp_path / "here", **kw)
    front = [r["deployment"] for r in here.deployments if r["on_front"]]
    assert front == ["1x1ch sn40l none vllm seqs 4 batch 256", "2x1ch sn40l least-outstanding vllm seqs 4 batch 256",
                     "3x1ch sn40l round-robin vllm seqs 4 batch 256"]
    assert all(r["offered_meets_slo"] is not None for r in here.deployments if r["on_front"])
    assert here.summary["phase_task_s"]["offered_runs"] > 0  # served by an offered task (their searches did not)
    vllm = SchedulerChoice("vllm", 4, 256)
    assert offered_groups([Deployment(1, 1, "none", vllm), Deployment(1, 2, "least-outstanding", vllm),
                           Deployment(1, 3, "round-robin", vllm)], 12) == [[0, 1, 2]]
    two = stepsim.plan(str(model), trace, out=tmp_path / "two", jobs=2, **kw)
    assert two.work["executor"] == "local, 2 workers"
    _same_files(tmp_path / "here", tmp_path / "two")


@pytest.mark.slow  # about 45 s at load 4: a fork server and a Dask cluster of two processes start, each pays as above
def test_the_command_line_runs_the_tasks_on_two_workers_and_on_dask(case, tmp_path, capsys, monkeypatch):
    model, trace, kw, _, tmp = case
    monkeypatch.setenv("STEPSIM_SERVE_CACHE", str(kw["calibration_cache"]))
    (tmp_path / "s.toml").write_text("chips_per_replica = [1]\nreplicas = [1]\n"
                                     "[[scheduler]]\npolicy = 'vllm'\nmax_seqs = [4]\nmax_batch_tokens = [256]\n")
    argv = ["plan", "--model", model, "--requests", str(trace), "--slo", SLO, "--space", str(tmp_path / "s.toml"),
            "--no-verify"]
    outs = {}
    for name, flags in (("here", []), ("two", ["--jobs", "2"]), ("dask", ["--executor", "dask"])):
        assert main([*argv, *flags, "--out", str(tmp_path / name)]) == 0
        lines = capsys.readouterr().out.splitlines()
        outs[name] = lines
        executor = {"here": "this process", "two": "local, 2 workers", "dask": "dask (local cluster), 2 worker processes"}
        assert lines[-2] == (f"tasks       1 deployment search(es) run ({executor[name]}), 0 read back from "
                             f"{tmp_path / name / WORK_FOLDER} (an earlier run of the same plan)")
    # the same plan printed (but where it was written): its counts, recommendation and serve commands
    printed = {name: [line.replace(str(tmp_path / name), "OUT") for line in lines[:-2]] for name, lines in outs.items()}
    assert printed["two"] == printed["here"] == printed["dask"]
    assert printed["here"][0] == "plan        1 deployments: 1 searched, 0 cut during their search, 0 pruned by a " \
                                 "bound, 0 infeasible; 9 full replays, 2 stopped early"
    _same_files(tmp_path / "here", tmp_path / "two")
    _same_files(tmp_path / "here", tmp_path / "dask")
    table = pq.read_table(tmp_path / "dask" / "deployments.parquet").to_pylist()
    assert [(r["deployment"], r["decided"], r["replays"]) for r in table] == [
        ("1x1ch sn40l none vllm seqs 4 batch 256", "simulated", 9)]


def test_jobs_and_executor_are_one_line_errors(tmp_path, capsys):
    base = ["plan", "--model", "m.json", "--requests", "t.csv", "--slo", "ttft=1s", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        main([*base, "--jobs", "2", "--executor", "dask"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "stepsim plan: error: argument --executor: not allowed with argument --jobs"
    with pytest.raises(SystemExit) as e:
        main([*base, "--executor", "ray"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "stepsim plan: error: argument --executor: invalid choice: 'ray' (choose from 'dask')"
    with pytest.raises(ConfigError, match=r"^--executor must be dask, got 'ray'$"):
        stepsim.plan("m.json", "t.csv", slo="ttft=1s", executor="ray")
    assert not (tmp_path / "o").exists()


def test_the_calibrations_are_ordered_so_the_workers_end_together():
    """Most chips first (the longest first) leaves the shortest calibration alone at the end; the order of the
    fewest estimated seconds (``1 + log2(chips) / 2`` each, the first such order from most chips first) ends two
    workers together: 16 and 8 chips, then 2 on the first free, 4, and 1 (3 + 2 = 2.5 + 1.5 + 1)."""
    from stepsim.plan.api import calibration_order

    shapes = [("sn40l", c) for c in (1, 2, 4, 8, 16)]
    assert [c for _, c in calibration_order(shapes, 2)] == [16, 8, 2, 4, 1]
    assert [c for _, c in calibration_order(shapes, 1)] == [16, 8, 4, 2, 1]  # one worker: any order, most first
    assert [c for _, c in calibration_order(shapes, 5)] == [16, 8, 4, 2, 1]  # one each
    many = [("sn40l", c) for c in range(1, 10)]  # more than 8 shapes: most chips first, no search
    assert [c for _, c in calibration_order(many, 2)] == list(range(9, 0, -1))
