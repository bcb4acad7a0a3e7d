"""stepsim plan's inputs: the space file's keys and values, every flag's range, each refused in one line before any
work (exit 2, the exact last line of stderr), and the routers on hand-made finish times."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepsim.base.errors import ConfigError
from stepsim.batch.executors import default_jobs
from stepsim.cli import main
from stepsim.plan.replicas import route
from stepsim.plan.space import DEFAULT_SPACE, deployments, load_space, parse_space

E = "stepsim: error: "


def test_the_default_space_holds_105_deployments_up_to_4_chips():
    deps = deployments(parse_space(DEFAULT_SPACE), 4, ["sn40l"])
    assert len(deps) == 105
    assert sorted({(d.chips_per_replica, d.replicas) for d in deps}) == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1),
                                                                         (2, 2), (4, 1)]
    assert {d.router for d in deps if d.replicas == 1} == {"none"}
    assert deps[0].label() == "1x1ch sn40l none vllm seqs 32 batch 2048"


@pytest.mark.parametrize("text, line", [
    ("replicas = [0]", "s.toml: replicas must be a non-empty list of integers in 1..4096, got [0]"),
    ("replicas = [1, 1]", "s.toml: replicas lists a value twice: [1, 1]"),
    ("chips_per_replica = [3]",
     "s.toml: chips_per_replica must be a non-empty list of 1, 2, 4, 8, 16 (the systems serve builds), got [3]"),
    ("routers = ['random']", "s.toml: routers must be a non-empty list of distinct round-robin, least-outstanding, "
                             "kv-load, got ['random']"),
    ("replica = [1]", "s.toml: unknown key 'replica' (known: chips_per_replica, replicas, routers, scheduler, "
     "disaggregated)"),
    ("[[scheduler]]\npolicy = 'fifo'\nmax_seqs = [1]",
     "s.toml: scheduler[0].policy must be one of vllm, sarathi, orca, got 'fifo'"),
    ("[[scheduler]]\npolicy = 'orca'\nmax_seqs = [8]\nchunk_tokens = [64]",
     "s.toml: scheduler[0]: unknown key 'chunk_tokens' for policy orca (known: policy, max_seqs)"),
    ("[[scheduler]]\npolicy = 'vllm'\nmax_seqs = [0]",
     "s.toml: scheduler[0].max_seqs must be a non-empty list of integers in 1..2147483647, got [0]"),
    ("[[scheduler]]\npolicy = 'vllm'", "s.toml: scheduler[0].max_seqs is required (a list of integers >= 1)"),
    ("replicas = [", None),
])
def test_each_bad_space_key_is_one_line(tmp_path, text, line):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_space(path)
    msg = str(e.value).replace(str(tmp_path) + "/", "")
    if line is None:
        assert msg.startswith("--space s.toml: not valid TOML: ") and "\n" not in msg
    else:
        assert msg == line


def test_a_json_space_reads_as_the_toml_one(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps({"replicas": [1, 2], "routers": ["kv-load"]}))
    (tmp_path / "s.toml").write_text("replicas = [1, 2]\nrouters = ['kv-load']\n")
    assert load_space(tmp_path / "s.json") == load_space(tmp_path / "s.toml")
    with pytest.raises(ConfigError) as e:
        load_space(tmp_path / "none.toml")
    assert str(e.value) == f"--space {tmp_path / 'none.toml'}: no such file"


BASE = "plan --model qwen3-30b-a3b --requests {t} --slo ttft=2s,tpot=100ms --out {o}"


@pytest.mark.parametrize("extra, line", [
    ("--percentile 0", E + "--percentile must be a number in (0, 100], got 0.0"),
    ("--percentile 101", E + "--percentile must be a number in (0, 100], got 101.0"),
    ("--percentile nan", E + "--percentile must be a number in (0, 100], got nan"),
    ("--max-chips 0", E + "--max-chips must be an integer in 1..4096, got 0"),
    ("--max-chips 5000", E + "--max-chips must be an integer in 1..4096, got 5000"),
    ("--rate -1", E + "--rate must be a positive finite number, got -1.0"),
    ("--rate inf", E + "--rate must be a positive finite number, got inf"),
    ("--arrival-scale 0", E + "--arrival-scale must be a positive finite number, got 0.0"),
    ("--limit-requests 1", E + "--limit-requests must be an integer >= 2 (a rate needs two arrivals), got 1"),
    ("--hardware tpu", E + "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'tpu'"),
    ("--jobs 0", E + "--jobs must be an int >= 1 (leave it out to use every CPU: {cpus}), got 0"),
    ("--space {d}/none.toml", E + "--space {d}/none.toml: no such file"),
])
def test_each_bad_flag_is_one_line(tmp_path, capsys, extra, line):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n"
                     "2023-11-16 18:15:47.6805900,10,2\n")
    argv = (BASE.format(t=trace, o=tmp_path / "out") + " " + extra.format(d=tmp_path)).split()
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == line.format(d=tmp_path, cpus=default_jobs())
    assert not (tmp_path / "out").exists()


def test_a_missing_slo_and_both_rates_are_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(f"plan --model qwen3-30b-a3b --requests t.csv --out {tmp_path}/o".split())
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "stepsim plan: error: the following arguments are required: --slo"
    with pytest.raises(SystemExit) as e:
        main(f"plan --model m --requests t --slo ttft=1s --out {tmp_path}/o --rate 1 --arrival-scale 2".split())
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "stepsim plan: error: argument --arrival-scale: not allowed with argument --rate"


def test_least_outstanding_and_kv_load_route_by_the_replicas_state():
    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    kv = np.array([100, 10, 10, 10])
    # first round: nothing known, every routed request outstanding: balanced counts, lowest replica on ties
    assert route("least-outstanding", arrival, kv, 2, None, None).tolist() == [0, 1, 0, 1]
    # request 0 finishes at 1.5 on replica 0, request 1 runs to 10 on replica 1: request 2 (at 2.0) finds replica 0
    # empty, request 3 (at 3.0) finds one outstanding on each (ties: replica 0)
    previous = np.array([0, 1, 0, 1])
    finish = np.array([1.5, 10.0, 9.0, 9.0])
    assert route("least-outstanding", arrival, kv, 2, previous, finish).tolist() == [0, 1, 0, 0]
    # kv-load: request 1 avoids replica 0's 100 tokens, request 2 too (10 < 100), request 3 goes to replica 0 once
    # request 0 finished (at 1.5) and request 2 ... follows the finish times given
    assert route("kv-load", arrival, kv, 2, None, None).tolist() == [0, 1, 1, 1]
    assert route("kv-load", arrival, kv, 2, np.array([0, 1, 1, 1]), np.array([1.5, 10.0, 10.0, 10.0])).tolist() == \
        [0, 1, 0, 0]
    # a finish exactly at an arrival is not outstanding: request 1 (at 1.0) finds replica 0 empty; having moved
    # there, its finish is unknown (outstanding), so request 2 goes to replica 1 and request 3 ties back to 0
    assert route("least-outstanding", arrival, kv, 2, np.array([0, 1, 0, 1]),
                 np.array([1.0, 2.0, 9.0, 9.0])).tolist() == [0, 0, 1, 0]
    assert route("round-robin", arrival, kv, 3, None, None).tolist() == [0, 1, 2, 0]
