"""``stepsim.serve`` end to end: queueing theory with --iteration-latency, saturated throughput, outputs read
back, vLLM's metric formulas on our rows, byte-identical reruns, and every bad input as one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from serve_requests import requests_file

import stepsim
from stepsim.cli import main
from stepsim.serve.output import ITERATION_COLUMNS, REQUEST_COLUMNS, read_outputs
from stepsim.trace_io.requests import read_requests

T = 2.0**-6  # binary-exact step time (s)
MODEL = "qwen3-30b-a3b"


def test_md1_mean_wait_over_1e5_requests(tmp_path):
    # one sequence at a time, identical requests (P 16 <= budget, O 4): service S = 4 steps of 10 ms, deterministic
    n, t = 100_000, 0.01
    s_time = 4 * t
    rho = 0.5
    trace = requests_file(tmp_path / "same.parquet", np.zeros(n), 16, 4)
    r = stepsim.serve(MODEL, trace, arrival=f"poisson:{rho / s_time}", seed=5, max_seqs=1, iteration_latency=t)
    req = r.requests
    arrival = req["arrival_s"].to_numpy()
    wait = req["first_scheduled_s"].to_numpy() - arrival
    expected = rho * s_time / (2 * (1 - rho))  # M/D/1: rho / (2 mu (1 - rho)) = 0.02 s
    # sampling error over 10^5 requests at rho 0.5 is about 1 % (seeds 0-5 give -1.0 % .. +2.0 %); seed 5: +0.35 %.
    # Lindley's recursion below is the exact check of every wait
    assert abs(wait.mean() / expected - 1) < 0.02
    assert wait.mean() == pytest.approx(0.02006909156462193, abs=1e-15)
    # every request's wait follows Lindley's recursion W[k+1] = max(0, W[k] + S - A[k+1]) exactly (to rounding)
    lindley = np.empty(n)
    lindley[0] = 0.0
    gaps = np.diff(arrival)
    for k in range(n - 1):
        lindley[k + 1] = max(0.0, lindley[k] + s_time - gaps[k])
    assert np.abs(wait - lindley).max() < 1e-9
    # mean TTFT = wait + the prefill step; TPOT = ITL = the step time
    assert req["ttft_s"].to_numpy().mean() == pytest.approx(wait.mean() + t, abs=1e-9)
    assert r.summary["tpot_s"]["p99"] == pytest.approx(t, abs=1e-12)
    assert r.summary["requests"] == r.summary["completed"] == n and r.summary["iterations"] == 4 * n


@pytest.mark.parametrize("seqs", [1, 8, 32])
def test_saturated_throughput_is_batch_limit_over_step_time(tmp_path, seqs):
    # everyone arrives at 0 with a 1-token prompt: each step emits one token per running request, always `seqs`
    trace = requests_file(tmp_path / "t.parquet", np.zeros(64), 1, 4)
    r = stepsim.serve(MODEL, trace, max_seqs=seqs, iteration_latency=T)
    assert r.iterations["tokens"].to_pylist() == [seqs] * (64 * 4 // seqs)
    assert r.summary["throughput_tokens_per_s"] == seqs / T


def test_saturated_token_budget(tmp_path):
    # 64 prompts of 1024 tokens at 0: every step is exactly the 2048-token budget
    trace = requests_file(tmp_path / "t.parquet", np.zeros(64), 1024, 1)
    r = stepsim.serve(MODEL, trace, iteration_latency=T)
    tokens = r.iterations["tokens"].to_numpy()
    assert tokens.tolist() == [2048] * 32
    assert tokens.sum() / r.summary["duration_s"] == 2048 / T
    assert r.summary["throughput_requests_per_s"] == 64 / (32 * T)


def _conv_run(conv_csv, out, seed=1):
    return stepsim.serve(MODEL, conv_csv, out=out, limit_requests=400, arrival="poisson:2", seed=seed,
                         iteration_latency=0.025, slo="ttft=300ms,tpot=30ms", hbm_bytes=62_000_000_000)


@pytest.fixture(scope="module")
def conv_a(shared_traces, tmp_path_factory):
    """``(result, folder)`` of :func:`_conv_run` at seed 1, made once for the module: the read-back test reads it and
    the same-bytes test compares a second run of the same inputs (and one of another seed) with it."""
    folder = tmp_path_factory.mktemp("conv") / "a"
    return _conv_run(shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv", folder), folder


def test_outputs_read_back_and_vllm_metric_parity(conv_csv, conv_a):
    r, folder = conv_a
    req, it, summary = read_outputs(folder)
    assert req.column_names == list(REQUEST_COLUMNS)
    assert it.column_names == list(ITERATION_COLUMNS)
    assert req.equals(r.requests) and it.equals(r.iterations)
    assert summary == json.loads(json.dumps(r.summary))
    assert pq.read_schema(folder / "requests.parquet").field("ttft_s").metadata == {b"unit": b"s"}
    # a small KV cache makes vLLM preempt: 62 GB of HBM - 61,064,220,672 bytes of weights (30,532,110,336 bf16
    # parameters) = 935,779,328 bytes = 594 blocks of 16 x 98,304 bytes, one of them the null block
    weights = 2 * (48 * (2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 128 * 3 * 2048 * 768 + 2048 * 128 + 2 * 2048)
                   + 2 * 151936 * 2048 + 2048)
    assert summary["kv_cache"]["weight_bytes"] == weights == 61_064_220_672
    assert summary["kv_cache"]["num_blocks"] == (62_000_000_000 - weights) // (16 * 48 * 2 * 4 * 128 * 2) == 594
    assert summary["kv_cache"]["usable_blocks"] == summary["kv_cache"]["max_blocks_used"] == 593
    assert summary["preemptions"] == int(req["preemptions"].to_numpy().sum()) == 765
    assert req["output_tokens"].to_pylist() == read_requests(conv_csv).output_tokens[:400].tolist()
    # vLLM's calculate_metrics on our rows
    arrival, first, finish = (req[c].to_numpy() for c in ("arrival_s", "first_token_s", "finish_s"))
    out_tokens = req["output_tokens"].to_numpy()
    ttft, e2e = first - arrival, finish - arrival
    tpot = [(e - f) / (o - 1) for e, f, o in zip(e2e, ttft, out_tokens) if o > 1]
    dur = finish.max() - arrival.min()
    assert summary["ttft_s"]["p99"] == float(np.percentile(ttft, 99))
    assert summary["tpot_s"]["mean"] == pytest.approx(float(np.mean(tpot)), rel=1e-12)
    assert summary["e2e_s"]["p50"] == float(np.percentile(e2e, 50))
    assert summary["throughput_tokens_per_s"] == out_tokens.sum() / dur
    good = (ttft <= 0.3) & np.array([(e - f) / (o - 1) <= 0.03 if o > 1 else True
                                     for e, f, o in zip(e2e, ttft, out_tokens)])
    assert summary["slo_attainment"] == good.sum() / 400 and summary["goodput_requests_per_s"] == good.sum() / dur
    # ITL pools every gap: sum(O - 1) of them
    # ITL pools every gap; preemption stalls are single large gaps that lift the mean above the step time
    assert summary["itl_s"]["p50"] == pytest.approx(0.025, abs=1e-12) and summary["itl_s"]["mean"] > 0.026


def test_same_seed_same_bytes(conv_csv, tmp_path, conv_a):
    shutil.copytree(conv_a[1], tmp_path / "a")  # the module's run at seed 1; b: the same inputs run again
    _conv_run(conv_csv, tmp_path / "b")
    _conv_run(conv_csv, tmp_path / "c", seed=2)
    for name in ("requests.parquet", "iterations.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a.pop("wall_s") > 0 and b.pop("wall_s") > 0 and a == b
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["iterations.parquet", "latency_cdf.png",
                                                                  "over_time.png", "requests.parquet", "summary.json"]
    assert (tmp_path / "a" / "latency_cdf.png").read_bytes() == (tmp_path / "b" / "latency_cdf.png").read_bytes()


def test_cli_text_and_json(conv_csv, tmp_path, capsys):
    assert main(["serve", "--model", MODEL, "--requests", str(conv_csv), "--limit-requests", "50",
                 "--iteration-latency", "0.02", "--out", str(tmp_path / "o"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary)[:6] == ["requests", "completed", "duration_s", "output_tokens", "throughput_tokens_per_s",
                                 "throughput_requests_per_s"]
    assert summary["requests"] == 50 and summary["fidelity"] == {"mode": "iteration-latency", "error": None}
    assert summary == {**json.loads((tmp_path / "o" / "summary.json").read_text()), "wall_s": summary["wall_s"]}
    assert main(["serve", "--model", MODEL, "--requests", str(conv_csv), "--duration", "10",
                 "--iteration-latency", "0.02", "--out", str(tmp_path / "p")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "requests    13 of 13 completed in 13.07 s, 482 steps, 0 preemptions"
    assert [line.split()[0] for line in lines] == ["requests", "throughput", "ttft", "tpot", "itl", "e2e", "KV",
                                                   "wrote"]


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.rstrip("\n")


@pytest.mark.parametrize("extra, message", [
    (["--slo", "ttft=2"], "--slo 'ttft=2': cannot parse 'ttft=2'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or "
                          "e2e, e.g. ttft=2s,tpot=200ms"),
    (["--slo", "ttft=2s,ttft=3s"], "--slo 'ttft=2s,ttft=3s': ttft is given twice"),
    (["--arrival", "poisson:-1"], "--arrival 'poisson:-1': expected poisson:RATE with RATE in requests per second > 0"),
    (["--arrival-scale", "0"], "--arrival-scale must be a positive number, got 0.0"),
    (["--limit-requests", "0"], "--limit-requests must be a positive integer, got 0"),
    (["--fidelity", "exact"], "--iteration-latency and --fidelity both price the steps; give one"),
    (["--routing", "synthetic"], "--routing is for the engine-backed latency (--fidelity exact|fast); "
                                 "--iteration-latency does not simulate layers"),
    (["--hardware", "tpu"], "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'tpu'"),
    (["--jobs", "2"], "--jobs is for the engine-backed latency (--fidelity exact|fast); --iteration-latency does not "
                      "simulate layers"),
    (["--executor", "dask"], "--executor is for the engine-backed latency (--fidelity exact|fast); "
                             "--iteration-latency does not simulate layers"),
    (["--address", "tcp://127.0.0.1:1"], "--address is only for --executor dask"),
    (["--timeline", "t.txt"], "--timeline t.txt: unknown trace format (use .pftrace or .perfetto-trace for "
                              "Perfetto protobuf, .json or .json.gz for Chrome JSON)"),
    (["--scheduler", "orca", "--max-batch-tokens", "10"], "--max-batch-tokens is vLLM's token budget; orca has none "
                                                          "(it never chunks)"),
])
def test_cli_bad_flags_are_one_line(tmp_path, capsys, extra, message):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 1.0], 10, 10)
    argv = ["serve", "--model", MODEL, "--requests", str(trace), "--iteration-latency", "0.01",
            "--out", str(tmp_path / "o"), *extra]
    assert _error(capsys, argv) == f"stepsim: error: {message}"
    assert not (tmp_path / "o").exists()


def test_cli_bad_inputs_are_one_line(tmp_path, capsys):
    base = ["serve", "--iteration-latency", "0.01", "--out", str(tmp_path / "o")]
    trace = requests_file(tmp_path / "t.parquet", [0.0, 1.0], [10, 40000], 1000)
    assert _error(capsys, [*base, "--model", MODEL, "--requests", str(trace)]) == (
        f"stepsim: error: {trace}: row 1: prompt 40000 + output 1000 tokens exceed the longest sequence the engine "
        "takes, 40960 tokens (the model's max_position_embeddings is 40960); --drop-long leaves such requests out, "
        "--truncate-long shortens their prompts")
    assert _error(capsys, [*base, "--model", "mixtral-8x7b", "--requests", str(trace)]) == (
        "stepsim: error: the model's weights (93.41 GB) do not fit in HBM (68.72 GB): 24.69 GB short; "
        "serve it on several chips with --system FILE")
    bad = tmp_path / "neg.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, -1.0], "prompt_tokens": [1, 1], "output_tokens": [1, 1]}), bad)
    assert _error(capsys, [*base, "--model", MODEL, "--requests", str(bad)]) == (
        f"stepsim: error: {bad}: row 1, column 'arrival_s': negative arrival -1.0 s")
    assert _error(capsys, ["serve", "--model", MODEL, "--requests", str(trace), "--out", str(tmp_path / "o")]) == (
        "stepsim: error: stepsim serve needs --iteration-latency SECONDS or --fidelity exact|fast")
    assert _error(capsys, [*base, "--model", MODEL, "--requests", str(trace), "--iteration-latency", "-1"]) == (
        "stepsim: error: --iteration-latency must be a positive number of seconds, got -1.0")


def test_prompt_longer_than_kv_capacity(tmp_path):
    from stepsim.base.errors import TraceValueError

    trace = requests_file(tmp_path / "t.parquet", [0.0, 1.0], [10, 9000], 1000)
    with pytest.raises(TraceValueError) as e:
        stepsim.serve(MODEL, trace, iteration_latency=0.01, hbm_bytes=62_000_000_000)
    assert str(e.value) == (f"{trace}: row 1: prompt 9000 + output 1000 tokens exceed the longest sequence the engine "
                            "takes, 9488 tokens (the KV cache holds 9488 tokens (593 blocks of 16)); --drop-long "
                            "leaves such requests out, --truncate-long shortens their prompts")
