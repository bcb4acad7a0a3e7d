"""Requests longer than the engine takes (prompt + output beyond ``max_model_len``): refused naming the row and the
limit by default; ``--drop-long`` leaves them out and ``--truncate-long`` keeps the last tokens of their prompts
that fit (vLLM's benchmark conventions), both counted in the summary's ``long_requests`` and the second line of the
output; serving sweeps take both knobs. The model is Qwen3's 4-layer file with ``max_position_embeddings`` 64 (the
KV cache holds far more, so 64 is the limit), and the DeepSeek-MoE preset (4,096) on a trace of its own."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from serve_requests import requests_file

import stepsim
from stepsim.base.errors import ConfigError, TraceValueError
from stepsim.cli import main
from stepsim.results.serve_record import read_serve_folder

E = "stepsim: error: "
MODEL4 = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "qwen3-30b-a3b-4layers.json")
LIMIT = 64
HINT = "--drop-long leaves such requests out, --truncate-long shortens their prompts"
WHY = f"the model's max_position_embeddings is {LIMIT}"
#: rows 1 (70 + 4) and 2 (50 + 20) are too long; row 3 (30 + 34) fits exactly
PROMPTS, OUTPUTS = [10, 70, 50, 30], [5, 4, 20, 34]


@pytest.fixture
def model(tmp_path):
    config = json.loads(open(MODEL4).read())
    path = tmp_path / "m64.json"
    path.write_text(json.dumps({**config, "max_position_embeddings": LIMIT}))
    return path


def _cli(capsys, model, trace, out, *flags):
    status = main(["serve", "--model", str(model), "--requests", str(trace), "--iteration-latency", "0.01", "--out",
                   str(out), *flags])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out.splitlines(), captured.err.splitlines()


def test_without_a_flag_the_first_long_request_is_refused_with_its_row_and_the_limit(tmp_path, capsys, model):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.1, 0.2, 0.3], PROMPTS, OUTPUTS)
    assert _cli(capsys, model, trace, tmp_path / "out") == (2, [], [
        f"{E}{trace}: row 1: prompt 70 + output 4 tokens exceed the longest sequence the engine takes, 64 tokens "
        f"({WHY}); {HINT}"])
    assert not (tmp_path / "out").exists()


def test_drop_long_leaves_the_long_requests_out_and_counts_them(tmp_path, capsys, model):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.1, 0.2, 0.3], PROMPTS, OUTPUTS)
    status, out, err = _cli(capsys, model, trace, tmp_path / "out", "--drop-long")
    assert (status, err) == (0, [])
    assert out[:2] == ["requests    2 of 2 completed in 0.64 s, 39 steps, 0 preemptions",
                       "long        2 request(s) dropped: prompt + output beyond 64 tokens (--drop-long)"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["long_requests"] == {"policy": "drop", "max_model_len": 64, "dropped": 2, "truncated": 0,
                                        "prompt_tokens_removed": 0}
    requests = pq.read_table(tmp_path / "out" / "requests.parquet")
    assert requests.column("request_id").to_pylist() == [0, 3]  # the rows kept, by their own ids
    # the same as a trace holding only those rows (the files differ in their inputs' metadata only)
    alone = requests_file(tmp_path / "a.parquet", [0.0, 0.3], [10, 30], [5, 34], [0, 3])
    plain = stepsim.serve(model, alone, iteration_latency=0.01)
    assert requests.to_pylist() == plain.requests.to_pylist()
    assert read_serve_folder(tmp_path / "out")["long_requests"] == "drop"  # compare pairs runs by it


def test_truncate_long_keeps_the_prompts_last_tokens_that_fit(tmp_path, capsys, model):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.1, 0.2, 0.3], PROMPTS, OUTPUTS)
    status, out, err = _cli(capsys, model, trace, tmp_path / "out", "--truncate-long")
    assert (status, err) == (0, [])
    assert out[1] == "long        2 prompt(s) truncated to fit 64 tokens, 16 prompt tokens removed (--truncate-long)"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["long_requests"] == {"policy": "truncate", "max_model_len": 64, "dropped": 0, "truncated": 2,
                                        "prompt_tokens_removed": 16}  # 70 -> 60 and 50 -> 44
    requests = pq.read_table(tmp_path / "out" / "requests.parquet")
    assert requests.column("prompt_tokens").to_pylist() == [10, 60, 44, 30]
    assert requests.column("output_tokens").to_pylist() == OUTPUTS  # outputs are never shortened
    same = requests_file(tmp_path / "s.parquet", [0.0, 0.1, 0.2, 0.3], [10, 60, 44, 30], OUTPUTS)
    assert requests.to_pylist() == stepsim.serve(model, same, iteration_latency=0.01).requests.to_pylist()


def test_a_trace_without_long_requests_is_the_same_run_with_either_flag(tmp_path, model):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.3], [10, 30], [5, 34])
    plain = stepsim.serve(model, trace, iteration_latency=0.01)
    assert "long_requests" not in plain.summary  # absent without a flag: earlier runs' summaries are unchanged
    for flag in ("drop_long", "truncate_long"):
        run = stepsim.serve(model, trace, iteration_latency=0.01, **{flag: True})
        assert run.requests.to_pylist() == plain.requests.to_pylist()
        assert run.summary["long_requests"]["dropped"] + run.summary["long_requests"]["truncated"] == 0


REFUSALS = [  # (prompts, outputs, flags, message after "<trace>: " or the whole line); * none existed
    ([10, 3], [5, 64], ["--truncate-long"],
     f"row 1: output 64 tokens alone leave no room for a prompt token in the longest sequence the engine takes, 64 "
     f"tokens ({WHY}); --truncate-long shortens prompts only, --drop-long leaves such requests out"),
    ([70, 50], [4, 20], ["--drop-long"],
     f"every one of the 2 requests exceeds the longest sequence the engine takes, 64 tokens ({WHY}); --drop-long "
     "leaves nothing to serve"),
]


@pytest.mark.parametrize("prompts, outputs, flags, message", REFUSALS, ids=range(len(REFUSALS)))
def test_what_no_policy_can_serve_is_one_line(tmp_path, capsys, model, prompts, outputs, flags, message):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.1], prompts, outputs)
    assert _cli(capsys, model, trace, tmp_path / "out", *flags) == (2, [], [f"{E}{trace}: {message}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kw, message", [
    ({"drop_long": "yes"}, "--drop-long must be true or false, got 'yes'"),
    ({"truncate_long": 1}, "--truncate-long must be true or false, got 1"),
    ({"drop_long": True, "truncate_long": True}, "--drop-long and --truncate-long both handle requests longer than "
                                                 "the model takes; give one"),
])
def test_python_callers_get_typed_errors(tmp_path, model, kw, message):
    trace = requests_file(tmp_path / "t.parquet", [0.0], 10, 2)
    with pytest.raises(ConfigError) as e:
        stepsim.serve(model, trace, iteration_latency=0.01, out=tmp_path / "out", **kw)
    assert str(e.value) == message
    assert not (tmp_path / "out").exists()


def test_both_flags_on_the_command_line_are_refused(tmp_path, capsys, model):
    trace = requests_file(tmp_path / "t.parquet", [0.0], 10, 2)
    with pytest.raises(SystemExit) as e:  # argparse's own refusal of a mutually exclusive pair: usage, then one line
        _cli(capsys, model, trace, tmp_path / "out", "--drop-long", "--truncate-long")
    captured = capsys.readouterr()
    assert (e.value.code, captured.out, captured.err.splitlines()[-1]) == (
        2, "", "stepsim serve: error: argument --truncate-long: not allowed with argument --drop-long")
    assert not (tmp_path / "out").exists()


def test_deepseek_moe_on_requests_beyond_its_context(tmp_path, capsys):
    # the case: DeepSeek-MoE-16B (max_position_embeddings 4,096) could not serve a trace with longer requests
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5, 1.0], [4000, 100, 3000], [200, 50, 96])
    status, out, err = _cli(capsys, "deepseek-moe-16b", trace, tmp_path / "r")
    assert (status, err) == (2, [f"{E}{trace}: row 0: prompt 4000 + output 200 tokens exceed the longest sequence "
                                 "the engine takes, 4096 tokens (the model's max_position_embeddings is 4096); "
                                 f"{HINT}"])
    status, out, err = _cli(capsys, "deepseek-moe-16b", trace, tmp_path / "d", "--drop-long")
    assert (status, err, out[1]) == (0, [], "long        1 request(s) dropped: prompt + output beyond 4096 tokens "
                                            "(--drop-long)")
    status, out, err = _cli(capsys, "deepseek-moe-16b", trace, tmp_path / "t", "--truncate-long")
    assert (status, err, out[1]) == (0, [], "long        1 prompt(s) truncated to fit 4096 tokens, 104 prompt tokens "
                                            "removed (--truncate-long)")
    assert pq.read_table(tmp_path / "t" / "requests.parquet").column("prompt_tokens").to_pylist() == [3896, 100, 3000]


SWEEP = """workload = "serve"
out = "out"
[fixed]
model = "{model}"
requests = "t.parquet"
iteration_latency = 0.01
{extra}
[axes]
max_seqs = [1, 4]
"""


def test_a_serving_sweep_drops_or_truncates_long_requests(tmp_path, capsys, model):
    requests_file(tmp_path / "t.parquet", [0.0, 0.1, 0.2, 0.3], PROMPTS, OUTPUTS)
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(model=model, extra="").replace("[axes]\n", "[axes]\ndrop_long = [true, false]\n"
                                                                "truncate_long = [false]\n"))
    from stepsim.serve.sweep import read_serve_sweep

    assert main(["sweep", str(path), "--no-progress"]) == 1  # the tasks without a policy fail, naming the row
    rows = sorted(read_serve_sweep(tmp_path / "out").to_pylist(), key=lambda r: r["config"])
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    assert [json.loads(r["config"])["max_seqs"] for r in ok] == [1, 4]
    assert {r["long_requests"] for r in ok} == {"drop"} and {r["completed"] for r in ok} == {2}
    assert {r["error_message"] for r in failed} == {
        f"{tmp_path}/t.parquet: row 1: prompt 70 + output 4 tokens exceed the longest sequence the engine takes, 64 "
        f"tokens ({WHY}); {HINT}"}
    capsys.readouterr()


@pytest.mark.parametrize("extra, message", [
    ('drop_long = "yes"', "{f} (task max_seqs=1): drop_long must be true or false, got 'yes'"),
    ("drop_long = true\ntruncate_long = true", "{f} (task max_seqs=1): --drop-long and --truncate-long both handle "
                                               "requests longer than the model takes; give one"),
])
def test_bad_long_request_knobs_of_a_sweep_are_one_line_before_any_task(tmp_path, capsys, model, extra, message):
    requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(model=model, extra=extra))
    assert main(["sweep", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == E + message.format(f=path) + "\n"
    assert not (tmp_path / "out").exists()


def test_refused_without_a_flag_in_python_too(tmp_path, model):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.1], [10, 70], [5, 4])
    with pytest.raises(TraceValueError) as e:
        stepsim.serve(model, trace, iteration_latency=0.01)
    assert str(e.value) == (f"{trace}: row 1: prompt 70 + output 4 tokens exceed the longest sequence the engine "
                            f"takes, 64 tokens ({WHY}); {HINT}")
