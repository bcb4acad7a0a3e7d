"""Disaggregated serving (stepsim/serve/disaggregated.py, kv_transfer.py, disaggregated_serve.py; issue 42): the KV
transfer's closed form against the engine's link units, transfer times by hand from the link's bandwidth and
latency, a lone request's TTFT, the whole per-request table of a small run, the files read back, the errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from serve_requests import requests_file

from stepsim.base.errors import ConfigError
from stepsim.base.system import System
from stepsim.cli import main
from stepsim.models.presets import resolve_model
from stepsim.serve.disaggregated_serve import serve_disaggregated
from stepsim.serve.kv_transfer import (
    KVTransferPricer,
    closed_form_cycles,
    engine_transfer_cycles,
    kv_transfer_bytes,
    transfer_pairs,
)
from stepsim.serve.output import read_outputs

MODEL4 = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "qwen3-30b-a3b-4layers.json")
E = "stepsim: error: "
#: ring-2's links: 64 bytes/cycle, 500 cycles; sn40l's clock 1 GHz; the 4-layer model's KV: 8,192 bytes a token
#: (4 layers x 4 KV heads x 128 x key and value x 2 bytes)
LATENCY, BANDWIDTH, CLOCK, KV_PER_TOKEN = 500, 64, 1e9, 8192


def _hand_seconds(prompt: int) -> float:
    """One hop over an idle link: latency + ceil(bytes / bandwidth) cycles at the clock."""
    return (LATENCY + -(-prompt * KV_PER_TOKEN // BANDWIDTH)) / CLOCK


def test_kv_bytes_are_the_models_per_token_bytes_times_the_prompt():
    model = resolve_model(MODEL4)
    assert kv_transfer_bytes(model, 374) == 374 * KV_PER_TOKEN == 3_063_808
    # gpt-oss-20b: 12 full layers keep every token, 12 sliding layers their last window - 1 = 127 (24,576 bytes a
    # token each kind); DeepSeek-V3: MLA's latent, 70,272 bytes a token
    gpt = resolve_model("gpt-oss-20b")
    assert kv_transfer_bytes(gpt, 100) == 100 * 24_576 + 100 * 24_576
    assert kv_transfer_bytes(gpt, 1000) == 1000 * 24_576 + 127 * 24_576
    assert kv_transfer_bytes(resolve_model("deepseek-v3"), 10) == 702_720
    assert transfer_pairs(1, 1) == ((0, 1),)
    assert transfer_pairs(3, 2) == ((0, 3), (1, 4), (2, 3))


@pytest.mark.parametrize("system, split, expected", [
    ("ring-2", (1, 1), [501, 564, 16126, 1929513]),
    ("ring-4", (1, 1), [501, 564, 16126, 1929513]),
    ("fully-connected-8", (2, 2), [501, 532, 8313, 965007]),
    ("fully-connected-8", (3, 2), [501, 522, 5709, 643505]),
    ("switch-8", (2, 2), [501, 563, 16125, 1929513]),  # two hops of 250 cycles through the switch
])
def test_transfer_closed_form_equals_the_engine(system, split, expected):
    s = System.preset(system)
    pairs = transfer_pairs(*split)
    sizes = (2, 4096, 1_000_002, 123_456_790)
    assert [closed_form_cycles(s, pairs, n) for n in sizes] == expected
    assert [engine_transfer_cycles(s, pairs, n) for n in sizes] == expected


def test_shared_links_are_left_to_the_engine():
    s = System.preset("ring-4")
    pairs = transfer_pairs(2, 2)  # 0 -> 2 and 1 -> 3 both cross chip1 -> chip2
    assert closed_form_cycles(s, pairs, 4096) is None
    pricer = KVTransferPricer(s, 2, 2)
    assert pricer.cycles(4096) == engine_transfer_cycles(s, pairs, 4096) == 1063
    assert pricer.cycles(4096) == 1063 and pricer.simulated == 1  # memoised


def test_transfer_time_by_hand():
    pricer = KVTransferPricer(System.preset("ring-2"), 1, 1)
    nbytes = 374 * KV_PER_TOKEN
    assert pricer.cycles(nbytes) == LATENCY + nbytes // BANDWIDTH == 48_372
    assert pricer.seconds(nbytes) == 48_372 / 1e9  # ring-2's chips: step-eval at 1 GHz too
    assert pricer.cycles(0) == 0


def _serve(trace, **kw):
    args = dict(disaggregate="1:1", system="ring-2", iteration_latency=0.01, hardware="sn40l")
    args.update(kw)
    return serve_disaggregated(MODEL4, trace, **args)


def test_a_lone_request_ttft_is_prefill_plus_transfer_plus_first_decode_step(tmp_path):
    trace = requests_file(tmp_path / "one.parquet", [0.0], 374, 3)
    x = _hand_seconds(374)
    decode = _serve(trace).requests  # the default
    first = 0.0 + 0.01 + x + 0.01  # prefill step, the transfer, the decode pool's first step
    assert decode["ttft_s"].to_pylist() == [first]
    assert decode["finish_s"].to_pylist() == [first + 0.01 + 0.01]
    assert decode["transfer_end_s"].to_pylist() == [0.01 + x]
    # DistServe's TTFT: the prefill's token; the transfer falls in the gap to the second token
    prefill = _serve(trace, first_token="prefill").requests
    assert prefill["ttft_s"].to_pylist() == [0.01]
    assert prefill["finish_s"].to_pylist() == [0.01 + x + 0.01 + 0.01]
    assert prefill["tpot_s"].to_pylist() == [(0.01 + x + 0.01 + 0.01 - 0.01) / 2]


def test_transfers_queue_for_the_links(tmp_path):
    """Two prompts prefilled in one step: the second transfer waits for the first (first come, first served)."""
    trace = requests_file(tmp_path / "two.parquet", [0.0, 0.0], [374, 91], 2)
    t = _serve(trace).requests
    a, b = _hand_seconds(374), _hand_seconds(91)
    assert t["prefill_end_s"].to_pylist() == [0.01, 0.01]
    assert t["transfer_start_s"].to_pylist() == [0.01, 0.01 + a]
    assert t["transfer_end_s"].to_pylist() == [0.01 + a, 0.01 + a + b]
    assert t["kv_transfer_bytes"].to_pylist() == [374 * KV_PER_TOKEN, 91 * KV_PER_TOKEN]


COLUMNS = ("arrival_s", "prefill_end_s", "transfer_start_s", "transfer_end_s", "first_token_s", "finish_s",
           "kv_transfer_bytes", "preemptions")
#: the first 5 conversation requests at 20x their rate, 10 ms a step, at most 2 running a pool
TABLE = {
    "prefill": [
        (0.0, 0.01, 0.01, 0.010048372, 0.01, 0.44004837200000024, 3063808, 0),
        (0.21572895000000003, 0.22572895000000004, 0.22572895000000004, 0.22578013800000005, 0.22572895000000004,
         1.310048372000001, 3244032, 0),
        (0.22709385000000004, 0.23709385000000005, 0.23709385000000005, 0.23720686200000005, 0.23709385000000005,
         0.9800483720000007, 7200768, 0),
        (0.23552135000000002, 0.24709385000000006, 0.24709385000000006, 0.24710599800000005, 0.24709385000000006,
         1.1300483720000007, 745472, 0),
        (0.29463275000000005, 0.30463275000000006, 0.30463275000000006, 0.30464489800000005, 0.30463275000000006,
         1.2800483720000009, 745472, 0)],
    "decode": [
        (0.0, 0.01, 0.01, 0.010048372, 0.020048372000000002, 0.45004837200000025, 3063808, 0),
        (0.21572895000000003, 0.22572895000000004, 0.22572895000000004, 0.22578013800000005, 0.2400483720000001,
         1.320048372000001, 3244032, 0),
        (0.22709385000000004, 0.23709385000000005, 0.23709385000000005, 0.23720686200000005, 0.46004837200000026,
         1.0000483720000006, 7200768, 0),
        (0.23552135000000002, 0.24709385000000006, 0.24709385000000006, 0.24710599800000005, 1.0100483720000006,
         1.1600483720000008, 745472, 0),
        (0.29463275000000005, 0.30463275000000006, 0.30463275000000006, 0.30464489800000005, 1.1700483720000008,
         1.320048372000001, 745472, 0)],
}


@pytest.mark.parametrize("first_token, steps", [("prefill", (135, 130)), ("decode", (136, 131))])
def test_whole_request_table_of_a_small_run(conv_csv, tmp_path, first_token, steps):
    result = _serve(conv_csv, limit_requests=5, arrival_scale=0.05, max_seqs=2, first_token=first_token,
                    out=tmp_path / "out")
    t = result.requests
    assert [tuple(t[c][i].as_py() for c in COLUMNS) for i in range(t.num_rows)] == TABLE[first_token]
    s = result.summary
    assert (s["iterations"], s["disaggregated"]["decode"]["iterations"]) == steps
    spans = np.array([row[3] - row[2] for row in TABLE[first_token]])
    assert s["disaggregated"]["kv_transfer"] == {
        "transfers": 5, "bytes": 14_999_552, "seconds": float(spans.sum()), "max_s": float(spans.max()),
        "wait_s": 0.0, "pairs": [[0, 1]], "engine_simulations": 0, "closed_form": True}
    assert float(spans.sum()) == pytest.approx(sum(_hand_seconds(p) for p in (374, 396, 879, 91, 91)), rel=1e-12)
    assert float(spans.max()) == pytest.approx(_hand_seconds(879), rel=1e-12)  # float rounding of end - start
    # prefill steps compute prompts only; the decode pool's steps decode only
    it = result.iterations
    pool = np.asarray(it["pool"])
    assert (np.asarray(it["decode_tokens"])[pool == 0] == 0).all()
    assert (np.asarray(it["prefill_tokens"])[pool == 1] == 0).all()
    assert int((pool == 0).sum()) == steps[0] - steps[1]
    requests, iterations, summary = read_outputs(tmp_path / "out")  # the files, read back
    assert requests.equals(t) and iterations.equals(it)
    assert summary["disaggregated"] == json.loads(json.dumps(s["disaggregated"]))
    assert set(summary) >= {"ttft_s", "tpot_s", "itl_s", "e2e_s", "kv_cache", "fidelity", "system", "scheduler"}


def test_same_inputs_same_result(conv_csv):
    one = _serve(conv_csv, limit_requests=20, arrival_scale=0.02, max_seqs=4)
    two = _serve(conv_csv, limit_requests=20, arrival_scale=0.02, max_seqs=4)
    assert one.requests.equals(two.requests) and one.iterations.equals(two.iterations)


def _refused(capsys, tmp_path, conv_csv, *extra) -> str:
    status = main(["serve", "--model", MODEL4, "--requests", str(conv_csv), "--iteration-latency", "0.01",
                   "--limit-requests", "3", "--out", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and not (tmp_path / "out").exists()
    (line,) = err.splitlines()
    return line


@pytest.mark.parametrize("extra, message", [
    (("--disaggregate", "0:2", "--system", "ring-2"),
     "--disaggregate '0:2': expected P:D, prefill chips and decode chips, each an integer >= 1 (e.g. 2:2)"),
    (("--disaggregate", "2", "--system", "ring-2"),
     "--disaggregate '2': expected P:D, prefill chips and decode chips, each an integer >= 1 (e.g. 2:2)"),
    (("--disaggregate", "1:1"),
     "--disaggregate 1:1 moves the KV cache over a system's links: give --system (a preset or file of at least 2 "
     "chips)"),
    (("--disaggregate", "2:1", "--system", "ring-2"), "--disaggregate 2:1: 3 chips, but the system has 2"),
    (("--disaggregate", "1:1", "--system", "ring-2", "--timeline", "t.json"),
     "--timeline is not built with --disaggregate"),
    (("--first-token", "decode"),
     "--first-token is for --disaggregate P:D (a colocated run's first token is its prefill's)"),
    (("--disaggregate", "1:1", "--system", "ring-2", "--calibration-requests", "a.parquet"),
     "--calibration-requests is for a colocated run; with --disaggregate P:D each pool calibrates on its own steps"),
    (("--disaggregate", "2:2", "--system", "torus-4x4"),
     "--disaggregate with --system torus-4x4: a pool of 2 chips is cut from a system of one dimension (ring, "
     "fully-connected or switch); this one has 2 dimension(s)"),
])
def test_bad_disaggregation_is_one_line(capsys, tmp_path, conv_csv, extra, message):
    assert _refused(capsys, tmp_path, conv_csv, *extra) == E + message


def test_python_callers_get_the_same_errors(conv_csv):
    with pytest.raises(ConfigError, match=r"^--disaggregate \(0, 1\): expected P:D"):
        serve_disaggregated(MODEL4, conv_csv, disaggregate=(0, 1), system="ring-2", iteration_latency=0.01)
    with pytest.raises(ConfigError, match="^first_token must be prefill or decode, got 'both'$"):
        serve_disaggregated(MODEL4, conv_csv, disaggregate="1:1", system="ring-2", iteration_latency=0.01,
                            first_token="both")


#: tests/plan's small MoE model (2 layers, 16 experts): engine-backed runs of a few requests take seconds; its KV is
#: 2 layers x 2 KV heads x 32 x key and value x 2 bytes = 512 bytes a token
SMALL = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096}


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    return str(path)


def test_exact_pools_price_steps_as_colocated_serving(small, tmp_path):
    """A lone request of 2 output tokens at --fidelity exact: the prefill pool's step and the decode pool's step
    cost what colocated serving's two steps cost (the same batches), and the request ends after prefill +
    transfer (by hand: 500 + 300 x 512 / 64 cycles) + decode."""
    from stepsim.serve.api import serve

    trace = requests_file(tmp_path / "one.parquet", [0.0], 300, 2)
    kw = dict(fidelity="exact", hardware="sn40l", schedule="paper")
    colocated = serve(small, trace, **kw)
    disaggregated = serve_disaggregated(small, trace, disaggregate="1:1", system="ring-2", first_token="prefill",
                                        **kw)
    prefill_s, decode_s = colocated.iterations["duration_s"].to_pylist()
    assert (prefill_s, decode_s) == (6.3012e-05, 7.339e-06)
    assert disaggregated.iterations["duration_s"].to_pylist() == [prefill_s, decode_s]
    assert disaggregated.iterations["pool"].to_pylist() == [0, 1]
    x = (500 + 300 * 512 // 64) / 1e9
    assert disaggregated.requests["transfer_end_s"].to_pylist() == [prefill_s + x]
    assert disaggregated.requests["finish_s"].to_pylist() == [prefill_s + x + decode_s]
    assert disaggregated.summary["fidelity"]["mode"] == "exact"
    assert disaggregated.summary["disaggregated"]["prefill"]["fidelity"] == {"mode": "exact", "error": None}


def test_fast_pools_use_colocated_servings_calibration(small, tmp_path):
    """--fidelity fast: each pool of one chip is calibrated under the key colocated serving of one chip uses (its
    pilot is that colocated run), so it reuses that calibration."""
    from stepsim.serve.api import serve

    rng = np.random.default_rng(3)
    trace = requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 0.01, 12)), rng.integers(5, 400, 12),
                          rng.integers(2, 30, 12))
    kw = dict(fidelity="fast", hardware="sn40l", schedule="paper", calibration_cache=tmp_path / "cache")
    colocated = serve(small, trace, **kw)
    key = colocated.summary["fidelity"]["calibration"]
    one = serve_disaggregated(small, trace, disaggregate="1:1", system="ring-2", **kw)
    two = serve_disaggregated(small, trace, disaggregate="1:1", system="ring-2", **kw)
    assert one.summary["fidelity"]["calibration"] == key
    assert one.summary["disaggregated"]["prefill"]["fidelity"]["calibration"] == key
    assert one.summary["fidelity"]["error"] == colocated.summary["fidelity"]["error"]
    assert one.requests.equals(two.requests) and one.iterations.equals(two.iterations)
    pool = np.asarray(one.iterations["pool"])
    assert (np.asarray(one.iterations["decode_tokens"])[pool == 0] == 0).all()


def test_the_command_line_run_has_colocated_servings_summary_keys_and_the_transfers(capsys, tmp_path, conv_csv):
    def run(*extra):
        status = main(["serve", "--model", MODEL4, "--requests", str(conv_csv), "--iteration-latency", "0.01",
                       "--limit-requests", "5", "--hardware", "sn40l", "--slo", "ttft=2s,tpot=100ms", "--json",
                       *extra])
        assert status == 0
        return json.loads(capsys.readouterr().out)

    colocated = run("--out", str(tmp_path / "c"))
    disaggregated = run("--out", str(tmp_path / "d"), "--system", "ring-2", "--disaggregate", "1:1",
                        "--first-token", "decode")
    assert set(disaggregated) == set(colocated) | {"disaggregated", "system"}  # colocated: one chip, no system
    x = disaggregated["disaggregated"]["kv_transfer"]
    assert (x["transfers"], x["bytes"]) == (5, 14_999_552)  # 1,831 prompt tokens x 8,192 bytes
    assert disaggregated["disaggregated"]["first_token"] == "decode"
    _, iterations, summary = read_outputs(tmp_path / "d")
    assert summary["disaggregated"] == disaggregated["disaggregated"]
    assert summary["iterations"] == iterations.num_rows == disaggregated["iterations"]


def test_a_pool_of_two_chips_has_the_kv_cache_of_serving_on_two_chips(conv_csv):
    """2:2 on ring-4: each pool is the ring of 2 chips colocated serving uses (--system ring-2); the transfers 0 -> 2
    and 1 -> 3 share the link chip1 -> chip2, so the engine times them."""
    from stepsim.serve.api import serve

    d = _serve(conv_csv, disaggregate="2:2", system="ring-4", limit_requests=3)
    c = serve(MODEL4, conv_csv, system="ring-2", iteration_latency=0.01, hardware="sn40l", limit_requests=3)
    kv = {k: v for k, v in c.summary["kv_cache"].items() if k not in ("max_blocks_used", "max_model_len")}
    for pool in ("prefill", "decode"):
        got = d.summary["disaggregated"][pool]["kv_cache"]
        assert {k: got[k] for k in kv} == kv
    assert d.summary["system"]["chip_weight_bytes"] == 2 * c.summary["system"]["chip_weight_bytes"]
    x = d.summary["disaggregated"]["kv_transfer"]
    assert (x["pairs"], x["closed_form"], x["engine_simulations"]) == ([[0, 2], [1, 3]], False, 3)


def test_a_request_joins_the_decode_pool_when_it_has_kv_room(tmp_path):
    """40 KV blocks a pool (39 usable, 16 tokens each): two prompts of 374 tokens (24 blocks each) cannot be held
    together, so each pool serves them one after the other; the second transfer arrives while the first request
    decodes and waits for its blocks."""
    from stepsim.serve.memory import model_memory

    weights = model_memory(resolve_model(MODEL4)).weight_bytes
    trace = requests_file(tmp_path / "two.parquet", [0.0, 0.0], 374, 3)
    t = _serve(trace, hbm_bytes=weights + 40 * 16 * KV_PER_TOKEN, first_token="prefill").requests
    x = _hand_seconds(374)
    assert t["prefill_end_s"].to_pylist() == [0.01, 0.02]
    assert t["transfer_end_s"].to_pylist() == [0.01 + x, 0.02 + x]
    first_done = 0.01 + x + 0.01 + 0.01
    assert t["finish_s"].to_pylist() == [first_done, first_done + 0.01 + 0.01]
    assert t["first_token_s"].to_pylist() == [0.01, 0.02]


def test_a_one_token_output_ends_at_its_prefill_and_moves_nothing(tmp_path):
    trace = requests_file(tmp_path / "one.parquet", [0.0, 0.0], [374, 91], [1, 2])
    t = _serve(trace, first_token="prefill").requests
    assert t["kv_transfer_bytes"].to_pylist() == [0, 91 * KV_PER_TOKEN]
    assert t["transfer_start_s"].to_pylist() == [0.01, 0.01]  # nothing ahead of the second on the links
    assert t["finish_s"].to_pylist() == [0.01, 0.01 + _hand_seconds(91) + 0.01]
    decode = _serve(trace).requests  # the default: the decode pool gives the first token: it moves
    assert decode["kv_transfer_bytes"].to_pylist() == [374 * KV_PER_TOKEN, 91 * KV_PER_TOKEN]
