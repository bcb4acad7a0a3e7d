"""Files for the edge audit (tests/cli/test_audit_edges.py): each malformed, special or hostile input, written into a
fresh folder (issue 44's classes: malformed files, special files, free text that becomes a path, missing and unknown
keys, wrong types, values out of range)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

#: a Hugging Face config of a small MoE model (test_exact.py's SMALL)
SMALL = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096}

REQUESTS_CSV = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                "2023-11-16 18:15:47.6805900,37,4\n2023-11-16 18:15:48.6805900,100,10\n")


def _json(d: Path, name: str, value) -> None:
    (d / name).write_text(json.dumps(value))


def write_audit_files(d: Path) -> None:
    """Every input the audit's table names, under ``d``."""
    # request traces: a good one, then broken copies
    (d / "req.csv").write_text(REQUESTS_CSV)
    table = pa.table({"arrival_s": [0.0, 0.5, 1.0], "prompt_tokens": [374, 37, 100], "output_tokens": [44, 4, 10]})
    pq.write_table(table, d / "req.parquet")
    feather.write_feather(table, d / "req.arrow")
    whole = (d / "req.parquet").read_bytes()
    (d / "cut_end.parquet").write_bytes(whole[: len(whole) // 2])  # its footer lost
    arrow = (d / "req.arrow").read_bytes()
    (d / "cut_end.arrow").write_bytes(arrow[: len(arrow) // 2])
    for suffix in ("parquet", "arrow", "csv", "npz", "npy", "toml", "json", "onnx"):
        (d / f"empty.{suffix}").write_bytes(b"")
        (d / f"junk.{suffix}").write_bytes(bytes(range(256)) * 4)  # binary garbage
        (d / f"dir.{suffix}").mkdir()
    (d / "dup.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens,GeneratedTokens\n"
                               "2023-11-16 18:15:46.6805900,374,44,4\n")
    (d / "header_only.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    (d / "neg.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-374,44\n")
    (d / "zero_out.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,0\n")
    pq.write_table(pa.table({"arrival_s": [0.0, float("nan")], "prompt_tokens": [3, 4], "output_tokens": [4, 5]}),
                   d / "nan_arrival.parquet")
    pq.write_table(pa.table({"arrival_s": [0.0, float("inf")], "prompt_tokens": [3, 4], "output_tokens": [4, 5]}),
                   d / "inf_arrival.parquet")
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "prompt_tokens": [3.5, 4.0], "output_tokens": [4, 5]}),
                   d / "float_tokens.parquet")
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "prompt_tokens": ["3", "4"], "output_tokens": [4, 5]}),
                   d / "str_tokens.parquet")
    # special files
    for name in ("pipe.csv", "pipe.parquet", "pipe.json", "pipe.toml", "pipe.onnx", "pipe.npy"):
        os.mkfifo(d / name)
    for name in ("zero.json", "zero.onnx", "zero.parquet", "zero.toml"):
        (d / name).symlink_to("/dev/zero")
    (d / "dangling.json").symlink_to(d / "nowhere.json")
    # model configs
    _json(d, "small.json", SMALL)
    _json(d, "m_false.json", {**SMALL, "tie_word_embeddings": "false"})
    _json(d, "m_float.json", {**SMALL, "hidden_size": 256.5})
    _json(d, "m_negative.json", {**SMALL, "num_experts": -16})
    _json(d, "m_zero.json", {**SMALL, "num_hidden_layers": 0})
    _json(d, "m_string.json", {**SMALL, "hidden_size": "256"})
    _json(d, "m_huge.json", {**SMALL, "hidden_size": 10**30})
    (d / "m_nan.json").write_text(json.dumps(SMALL).replace('"hidden_size": 256', '"hidden_size": NaN'))
    (d / "m_inf.json").write_text(json.dumps(SMALL).replace('"max_position_embeddings": 4096',
                                                            '"max_position_embeddings": Infinity'))
    _json(d, "m_topk.json", {**SMALL, "num_experts_per_tok": 32})
    _json(d, "m_heads.json", {**SMALL, "num_key_value_heads": 3})
    _json(d, "m_list.json", [SMALL])
    _json(d, "m_null.json", {**SMALL, "hidden_size": None})
    _json(d, "m_bool.json", {**SMALL, "num_experts": True})
    missing = dict(SMALL)
    del missing["num_attention_heads"]
    _json(d, "m_missing.json", missing)
    # systems and hardware
    (d / "sys_dotdot.toml").write_text('name = "../../escaped"\nchips = 2\ntopology = "ring"\n')
    (d / "sys_quote.toml").write_text('name = "a\\"b"\nchips = 2\ntopology = "ring"\n')
    (d / "sys_topology.toml").write_text('chips = 2\ntopology = "torus"\n')
    (d / "sys_chips_nan.toml").write_text('chips = nan\ntopology = "ring"\n')
    (d / "sys_chips_zero.toml").write_text('chips = 0\ntopology = "ring"\n')
    (d / "sys_unknown.toml").write_text('chips = 2\ntopology = "ring"\nlink_bandwith = 5\n')
    (d / "hw_nan.toml").write_text("preset = 'sn40l'\nclock_hz = nan\n")
    (d / "hw_inf.toml").write_text("preset = 'sn40l'\nclock_hz = inf\n")
    (d / "hw_string.toml").write_text("preset = 'sn40l'\nhbm_channels = '8'\n")
    (d / "hw_float.toml").write_text("preset = 'sn40l'\nhbm_channels = 8.5\n")
    (d / "hw_big.toml").write_text("preset = 'sn40l'\nhbm_capacity_bytes = 1e308\n")
    # sweep files
    (d / "sw_enum.toml").write_text("workload = 'moe'\nmode = 'metrics'\n[axes]\ntiling = ['diagonal']\n")
    (d / "sw_nan.toml").write_text("workload = 'swiglu'\nmode = 'metrics'\n[axes]\ntile_m = [nan]\n")
    (d / "sw_inf.toml").write_text("workload = 'swiglu'\nmode = 'metrics'\n[axes]\ntile_m = [inf]\n")
    (d / "sw_float.toml").write_text("workload = 'swiglu'\nmode = 'metrics'\n[axes]\ntile_m = [16.5]\n")
    (d / "sw_axes_scalar.toml").write_text("workload = 'swiglu'\nmode = 'metrics'\n[axes]\ntile_m = 16\n")
    (d / "sw_mode.toml").write_text("workload = 'swiglu'\nmode = 'fastest'\n[axes]\ntile_m = [16]\n")
    (d / "sw_workload.toml").write_text("workload = 'conv2d'\n[axes]\ntile_m = [16]\n")
    (d / "sw_top.toml").write_text("workload = 'swiglu'\nmood = 'metrics'\n[axes]\ntile_m = [16]\n")
    (d / "sw_dotdot.toml").write_text("workload = 'swiglu'\nmode = 'metrics'\nout = '../../escaped'\n"
                                      "[axes]\ntile_m = [16]\n")
    serve = "workload = 'serve'\n[fixed]\nmodel = 'small.json'\nrequests = 'req.csv'\n"
    (d / "ss_latency_nan.toml").write_text(serve + "iteration_latency = nan\n[axes]\nmax_seqs = [8]\n")
    (d / "ss_latency_inf.toml").write_text(serve + "iteration_latency = inf\n[axes]\nmax_seqs = [8]\n")
    (d / "ss_latency_huge.toml").write_text(serve + "iteration_latency = 1e308\n[axes]\nmax_seqs = [8]\n")
    (d / "ss_seqs_zero.toml").write_text(serve + "iteration_latency = 0.02\n[axes]\nmax_seqs = [0]\n")
    (d / "ss_unknown.toml").write_text(serve + "iteration_latency = 0.02\n[axes]\nmax_seq = [8]\n")
    (d / "ss_scheduler.toml").write_text(serve + "iteration_latency = 0.02\n[axes]\nscheduler = ['fifo']\n")
    (d / "ss_string.toml").write_text(serve + "iteration_latency = '0.02'\n[axes]\nmax_seqs = [8]\n")
    (d / "ss_no_requests.toml").write_text("workload = 'serve'\n[fixed]\nmodel = 'small.json'\n"
                                           "iteration_latency = 0.02\n[axes]\nmax_seqs = [8]\n")
    # optimize spaces
    (d / "space_unknown.toml").write_text("[[axes]]\ntile_nn = [16, 32]\n")
    (d / "space_empty.toml").write_text("[[axes]]\ntile_n = []\n")
    (d / "space_nan.toml").write_text("[[axes]]\ntile_n = [nan]\n")
    (d / "space_type.toml").write_text("[[axes]]\ntile_n = ['big']\n")
    (d / "space_enum.toml").write_text("[[axes]]\ntiling = ['diagonal']\n")
    (d / "space_scalar.toml").write_text("axes = 5\n")
    # schedules (stepsim map --out): the test writes a good one and derives these
    # routing traces
    np.savez(d / "r8.npz", data=np.array([[0, 1], [2, 3], [4, 5], [6, 7]] * 4, dtype=np.int64))
    np.save(d / "routed_2d.npy", np.zeros((4, 2), dtype=np.int64))
    np.save(d / "routed_neg.npy", np.full((4, 2, 2), -1, dtype=np.int64))
    np.save(d / "routed_float.npy", np.zeros((4, 2, 2), dtype=np.float32))
    np.save(d / "kv_nan.npy", np.array([10.0, float("nan"), 30.0]))
    np.save(d / "kv_inf.npy", np.array([10.0, float("inf"), 30.0]))
    np.save(d / "kv_huge.npy", np.array([10, 2**62, 30], dtype=np.int64))
    np.save(d / "kv_frac.npy", np.array([10.5, 20.0, 30.0]))
    # paths with quotes
    (d / "it's \"quoted\".csv").write_text(REQUESTS_CSV)
    (d / "a_file").write_text("in the way")


#: a schedule as ``stepsim map ffn --model qwen --shape 64 --out FILE`` writes it (sn40l), and a decode one (--shape 16)
GOOD_SCHEDULE = {"kind": "ffn", "knobs": {"tile_n": 64, "tile_f": 32, "lanes": 2, "regions": 32}, "cycles": 695335,
                 "bound_cycles": 675194, "off_chip_bytes": 1067189248, "flops": 68316610560, "compute_units": 1040,
                 "memory_units": 420, "on_chip_bytes": 142626818,
                 "candidates": {"simulated": 132, "pruned": 548, "infeasible": 76}}
DECODE_SCHEDULE = {"kind": "decode", "knobs": {"regions": 16}, "cycles": 8179, "bound_cycles": 5635,
                   "off_chip_bytes": 8986624, "flops": 69902336, "compute_units": 1040, "memory_units": 147,
                   "on_chip_bytes": 1493632, "candidates": {"simulated": 5, "pruned": 0, "infeasible": 0}}


def write_audit_products(d: Path) -> None:
    """The audit's inputs made by stepsim itself: schedules (``stepsim map --out``'s form) and broken copies, an
    ONNX block (examples/onnx_blocks.py), a small run folder and a serve folder (the compare / report cases)."""
    import subprocess
    import sys

    from stepsim.cli import main

    repo = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, str(repo / "examples" / "onnx_blocks.py"), "llama", str(d / "block.onnx")],
                   check=True, capture_output=True)
    good = GOOD_SCHEDULE
    _json(d, "good_sched.json", good)
    _json(d, "s_decode.json", DECODE_SCHEDULE)
    _json(d, "s_missing_key.json", {k: v for k, v in good.items() if k != "knobs"})
    _json(d, "s_unknown_key.json", {**good, "knobz": 1})
    _json(d, "s_wrong_kind.json", {**good, "kind": "conv"})
    _json(d, "s_bad_type.json", {**good, "knobs": {**good["knobs"], "tile_n": "64"}})
    (d / "s_nan.json").write_text(json.dumps({**good, "knobs": {**good["knobs"], "tile_f": float("nan")}}))
    _json(d, "s_list.json", [good])
    np.savez(d / "r8b.npz", data=np.array([[0, 1], [2, 3], [4, 5], [6, 7]] * 4, dtype=np.int64))
    # a record folder as compare reads it (metrics: no engine run, so no kernel loading)
    assert main(["metrics", "moe", "--model", "custom", "--hidden", "64", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", str(d / "r8b.npz"), "--out", str(d / "run1")]) == 0
    assert main(["serve", "--model", "qwen", "--requests", str(d / "req.csv"), "--iteration-latency", "0.02",
                 "--out", str(d / "serve1")]) == 0
