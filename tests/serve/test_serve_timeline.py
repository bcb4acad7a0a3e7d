"""``--timeline``: the Perfetto trace of a serve run, read back track by track, slice by slice."""

from __future__ import annotations

import pytest
from serve_requests import requests_file

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.serve.timeline import read_timeline

T = 2.0**-6  # binary-exact step time (s): 15,625,000 ns
MODEL = "qwen3-30b-a3b"


def test_small_run_timeline_is_exactly_the_schedule(tmp_path):
    # r0 alone at 0 s (prefill 16, then 2 decodes); r1 (40 tokens, 1 output) and r2 (3 tokens, 2 outputs) at 0.25 s
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.25, 0.25], [16, 40, 3], [3, 1, 2])
    path = tmp_path / "tl" / "serve.pftrace"
    r = stepsim.serve(MODEL, trace, iteration_latency=T, timeline=path)
    assert r.files == {"timeline": path}
    tl = read_timeline(path)
    names = {uuid: name for uuid, (name, _) in tl["tracks"].items()}
    assert sorted((name, names.get(parent, "")) for name, parent in tl["tracks"].values()) == [
        ("KV blocks used", "engine"), ("engine", ""), ("request 0", "requests"), ("request 1", "requests"),
        ("request 2", "requests"), ("requests", ""), ("steps", "engine"), ("waiting requests", "engine")]
    q = 250_000_000
    assert tl["slices"] == {
        "request 0": [("queued", 0, 0, {"prompt_tokens": 16, "output_tokens": 3, "preemptions": 0}),
                      ("prefill", 0, 15_625_000, {}), ("decode", 15_625_000, 46_875_000, {})],
        "request 1": [("queued", q, q, {"prompt_tokens": 40, "output_tokens": 1, "preemptions": 0}),
                      ("prefill", q, 265_625_000, {})],
        "request 2": [("queued", q, q, {"prompt_tokens": 3, "output_tokens": 2, "preemptions": 0}),
                      ("prefill", q, 265_625_000, {}), ("decode", 265_625_000, 281_250_000, {})],
        "steps": [(f"step {i}", start, start + 15_625_000,
                   {"tokens": tokens, "sequences": seqs, "prefill_tokens": pre, "decode_tokens": tokens - pre})
                  for i, (start, tokens, seqs, pre) in enumerate([(0, 16, 1, 16), (15_625_000, 1, 1, 0),
                                                                  (31_250_000, 1, 1, 0), (q, 43, 2, 43),
                                                                  (265_625_000, 1, 1, 0)])],
    }
    starts = [0, 15_625_000, 31_250_000, q, 265_625_000]
    assert tl["counters"] == {"waiting requests": [(s, 0) for s in starts],
                              "KV blocks used": list(zip(starts, [1, 2, 2, 4, 1]))}


def test_timeline_follows_the_tables_and_reruns_give_the_same_bytes(tmp_path):
    # a queue builds up: 40 arrivals 1 ms apart, 2 sequences at a time, 15.6 ms steps
    n = 40
    trace = requests_file(tmp_path / "t.parquet", [0.001 * i for i in range(n)], [30 + 7 * i for i in range(n)],
                          [5 + i % 4 for i in range(n)])
    kw = dict(iteration_latency=T, max_seqs=2, out=tmp_path / "o")
    r = stepsim.serve(MODEL, trace, timeline=tmp_path / "a.pftrace", **kw)
    stepsim.serve(MODEL, trace, timeline=tmp_path / "b.perfetto-trace", **kw)
    assert (tmp_path / "a.pftrace").read_bytes() == (tmp_path / "b.perfetto-trace").read_bytes()
    tl = read_timeline(tmp_path / "a.pftrace")
    # the Chrome JSON forms hold the same tracks, slices and counters, and rerun to the same bytes too
    for name in ("c.json", "d.json.gz"):
        stepsim.serve(MODEL, trace, timeline=tmp_path / name, **kw)
        stepsim.serve(MODEL, trace, timeline=tmp_path / f"again-{name}", **kw)
        assert (tmp_path / name).read_bytes() == (tmp_path / f"again-{name}").read_bytes()
        assert read_timeline(tmp_path / name) == tl
    req, it = r.requests.to_pydict(), r.iterations.to_pydict()
    ns = lambda s: int(round(s * 1e9))  # noqa: E731
    for i, rid in enumerate(req["request_id"]):
        assert [s[:3] for s in tl["slices"][f"request {rid}"]] == [
            ("queued", ns(req["arrival_s"][i]), ns(req["first_scheduled_s"][i])),
            ("prefill", ns(req["first_scheduled_s"][i]), ns(req["first_token_s"][i])),
            ("decode", ns(req["first_token_s"][i]), ns(req["finish_s"][i]))]
    assert [s[:3] for s in tl["slices"]["steps"]] == [
        (f"step {i}", ns(s), ns(s + d)) for i, (s, d) in enumerate(zip(it["start_s"], it["duration_s"]))]
    assert tl["counters"]["waiting requests"] == [(ns(s), w) for s, w in zip(it["start_s"], it["waiting"])]
    # every request has arrived by the third step: 40 - 2 running wait
    assert max(w for _, w in tl["counters"]["waiting requests"]) == 38
    assert len(tl["slices"]["steps"]) == r.summary["iterations"]


def test_exact_run_annotates_each_step_with_its_cycles(tmp_path):
    import json

    from test_exact import SMALL

    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0005], [40, 7], [3, 2])
    r = stepsim.serve(str(tmp_path / "small.json"), trace, fidelity="exact", schedule="paper", timeline=tmp_path / "x.pftrace")
    steps = read_timeline(tmp_path / "x.pftrace")["slices"]["steps"]
    it = r.iterations.to_pydict()
    assert [s[3] for s in steps] == [
        {k: it[k][i] for k in ("tokens", "sequences", "prefill_tokens", "decode_tokens", "cycles_attention",
                               "cycles_ffn", "cycles_weights")} for i in range(len(steps))]
    assert [s[2] - s[1] for s in steps] == [sum(it[f"cycles_{k}"][i] for k in ("attention", "ffn", "weights"))
                                            for i in range(len(steps))]  # 1 GHz: 1 cycle = 1 ns
    from stepsim.serve.timeline import write_timeline

    write_timeline(tmp_path / "x.json", r.requests, r.iterations)
    assert read_timeline(tmp_path / "x.json") == read_timeline(tmp_path / "x.pftrace")


def test_cli_writes_the_timeline_and_refuses_other_formats_before_work(tmp_path, capsys):
    trace = requests_file(tmp_path / "t.parquet", [0.0], [16], [2])
    base = ["serve", "--model", MODEL, "--requests", str(trace), "--iteration-latency", str(T)]
    assert main([*base, "--out", str(tmp_path / "o"), "--timeline", str(tmp_path / "s.pftrace")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"{tmp_path / 's.pftrace'}")
    assert read_timeline(tmp_path / "s.pftrace")["slices"]["request 0"][1] == ("prefill", 0, 15_625_000, {})
    with pytest.raises(ConfigError) as e:
        stepsim.serve(MODEL, trace, iteration_latency=T, out=tmp_path / "p", timeline=tmp_path / "s.txt")
    assert str(e.value) == (f"--timeline {tmp_path / 's.txt'}: unknown trace format (use .pftrace or "
                            ".perfetto-trace for Perfetto protobuf, .json or .json.gz for Chrome JSON)")
    assert not (tmp_path / "p").exists()


def test_without_the_perfetto_package_the_timeline_is_refused_before_the_run(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "perfetto" else real(name, *a))
    trace = requests_file(tmp_path / "t.parquet", [0.0], [16], [2])
    with pytest.raises(ConfigError) as e:
        stepsim.serve(MODEL, trace, iteration_latency=T, out=tmp_path / "p", timeline=tmp_path / "s.pftrace")
    assert str(e.value) == (f"--timeline {tmp_path / 's.pftrace'}: writing a Perfetto trace needs the perfetto "
                            "package; install it with pip install 'stepsim[timeline]'")
    assert not (tmp_path / "p").exists()


def test_a_mapped_exact_run_shows_the_cycles_its_steps_hid_by_streaming_weights_ahead(tmp_path):
    import json

    from test_projections import TINY_DENSE

    from stepsim.serve.timeline import HIDDEN_TRACK

    (tmp_path / "tiny.json").write_text(json.dumps(TINY_DENSE))
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0], [40, 7], [3, 2])
    r = stepsim.serve(str(tmp_path / "tiny.json"), trace, fidelity="exact", schedule="auto",
                      timeline=tmp_path / "x.json")
    timeline = read_timeline(tmp_path / "x.json")
    it = r.iterations.to_pydict()
    steps = timeline["slices"]["steps"]
    kinds = ("attention", "ffn", "hidden", "weights")
    assert [s[3] for s in steps] == [{k: it[k][i] for k in ("tokens", "sequences", "prefill_tokens", "decode_tokens",
                                                            *(f"cycles_{c}" for c in kinds))} for i in range(len(steps))]
    # a step lasts its attention, FFN and weights cycles less those it hid (1 GHz: 1 cycle = 1 ns)
    assert [s[2] - s[1] for s in steps] == [it["cycles_attention"][i] + it["cycles_ffn"][i] + it["cycles_weights"][i]
                                            - it["cycles_hidden"][i] for i in range(len(steps))]
    assert timeline["counters"][HIDDEN_TRACK] == [(s[1], it["cycles_hidden"][i]) for i, s in enumerate(steps)]
    assert all(h > 0 for h in it["cycles_hidden"])
