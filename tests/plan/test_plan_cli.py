"""stepsim plan on the command line, end to end on one deployment (a small MoE model, 12 requests): --json prints
plan.json's object, the folder holds every file, the serve command it names serves the recommended replica, and
the same inputs give the same plan (but its wall time)."""

from __future__ import annotations

import json

import numpy as np

from stepsim.cli import main
from stepsim.trace_io.requests import RequestTrace, write_requests

SMALL = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096}


def test_plan_json_files_and_the_serve_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STEPSIM_SERVE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m.json").write_text(json.dumps(SMALL))
    rng = np.random.default_rng(5)
    write_requests(RequestTrace("t", np.arange(12), np.sort(rng.uniform(0, 0.01, 12)), rng.integers(5, 200, 12),
                                rng.integers(2, 20, 12)), tmp_path / "t.parquet")
    (tmp_path / "s.toml").write_text("chips_per_replica = [1]\nreplicas = [1]\n[[scheduler]]\npolicy = 'vllm'\n"
                                     "max_seqs = [128]\nmax_batch_tokens = [256]\n")
    argv = ["plan", "--model", str(tmp_path / "m.json"), "--requests", str(tmp_path / "t.parquet"), "--slo",
            "ttft=0.3ms,tpot=0.012ms", "--space", str(tmp_path / "s.toml"), "--no-verify", "--json"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert printed == written
    assert {p.name for p in (tmp_path / "a").iterdir()} == {"plan.json", "deployments.parquet", "plan.png",
                                                           "replica-0.parquet", ".plan-work"}
    rec = written["recommended"]
    assert rec["deployment"] == "1x1ch sn40l none vllm seqs 128 batch 256" and rec["decided"] == "simulated"
    assert written["deployments"] == written["simulated"] == 1
    (command,) = written["commands"]
    assert command == (f"stepsim serve --model {tmp_path / 'm.json'} --requests {tmp_path / 'a'}/replica-0.parquet "
                       "--hardware sn40l --scheduler vllm --max-seqs 128 --max-batch-tokens 256 --fidelity fast "
                       "--schedule auto --slo ttft=0.3ms,tpot=0.012ms --out serve-replica-0")
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b" / "plan.json").read_text())
    for s in (written, again):
        s.pop("wall_s"), s.pop("phase_wall_s"), s.pop("phase_task_s")
        s["commands"] = [c.replace("/b/", "/a/") for c in s["commands"]]
    assert again == written
