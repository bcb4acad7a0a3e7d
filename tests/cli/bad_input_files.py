"""Files for the bad-input table (tests/cli/test_bad_inputs.py): each is written into a fresh folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SWEEP_OK = '''workload = "swiglu"
mode = "metrics"

[axes]
tile_m = [16, 32]
'''


def write_bad_files(d: Path) -> None:
    """Every malformed input the table refers to, under ``d``."""
    (d / "text.npz").write_text("hello")
    np.savez(d / "object.npz", data=np.array([{"a": 1}], dtype=object))
    (d / "truncated.npz").write_bytes(b"PK\x03\x04" + b"\x00" * 20)
    np.savez(d / "no_data.npz", ids=np.zeros((2, 2), dtype=np.int64))
    np.savez(d / "rank3.npz", data=np.zeros((2, 2, 2), dtype=np.int64))
    np.savez(d / "floats.npz", data=np.zeros((4, 2), dtype=np.float32))
    np.savez(d / "out_of_range.npz", data=np.array([[0, 9]] * 4, dtype=np.int64))
    np.savez(d / "duplicate.npz", data=np.array([[1, 1]] * 4, dtype=np.int64))
    (d / "text.npy").write_text("hello")
    np.save(d / "object.npy", np.array([{"a": 1}], dtype=object))
    np.save(d / "kv_2d.npy", np.ones((4, 2), dtype=np.int64))
    np.save(d / "kv_negative.npy", np.array([10, -5, 20, 30], dtype=np.int64))
    (d / "garbage.arrow").write_bytes(b"not arrow at all")
    (d / "garbage.parquet").write_bytes(b"not parquet at all")
    pq.write_table(pa.table({"foo": [1, 2]}), d / "no_columns.parquet")
    (d / "requests.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,10\n")
    (d / "bad_row.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2023-11-16 18:15:46.6805900,10,5\nnot a time,ten,5\n")
    (d / "folder_npz").mkdir()
    np.savez(d / "folder_npz" / "layer10.npz", data=np.array([[0, 1]] * 4, dtype=np.int64))
    (d / "a_file").write_text("in the way")
    (d / "taken_units.parquet").mkdir()  # where `run --out taken.parquet` would write its unit table
    (d / "sweep_syntax.toml").write_text("[axes\nworkload = 'swiglu'\n")
    (d / "sweep_unknown.toml").write_text("workload = 'swiglu'\n[fixed]\ntile_mm = 16\n")
    (d / "sweep_type.toml").write_text("workload = 'swiglu'\n[axes]\ntile_m = ['big']\n")
    (d / "sweep_huge.toml").write_text("workload = 'swiglu'\nmode = 'metrics'\n[axes]\n"
                                       f"tile_m = {list(range(1, 201))}\ntile_n = {list(range(1, 101))}\n")
    (d / "sweep_empty_axis.toml").write_text("workload = 'swiglu'\n[axes]\ntile_m = []\n")
    (d / "sweep_no_workload.toml").write_text("mode = 'metrics'\n[axes]\ntile_m = [16]\n")
    (d / "sweep_ok.toml").write_text(SWEEP_OK)
    (d / "sweep_proc_out.toml").write_text('out = "/proc/sweep"\n' + SWEEP_OK)
    (d / "hw_syntax.toml").write_text("hbm_channels = \n")
    (d / "hw_unknown.toml").write_text("preset = 'step-eval'\nhbm_chanels = 4\n")
    (d / "hw_negative.toml").write_text("preset = 'step-eval'\nhbm_channels = -4\n")
    (d / "hw_depth.toml").write_text("preset = 'step-eval'\nchannel_depth = 0\n")
    (d / "hw_preset.toml").write_text("preset = 'step-fast'\n")
    (d / "config_bad.json").write_text("{not json")
    (d / "config_mla.json").write_text('{"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,'
                                       ' "moe_intermediate_size": 2048, "n_routed_experts": 256, '
                                       '"num_experts_per_tok": 8, "kv_lora_rank": 512, "q_lora_rank": 1536, '
                                       '"num_attention_heads": 128, "num_key_value_heads": 128, '
                                       '"num_hidden_layers": 61}')
    (d / "config_missing.json").write_text('{"model_type": "mixtral", "hidden_size": 4096}')
    (d / "traces_empty").mkdir()
    (d / "mixtral_b4").mkdir()
    np.savez(d / "mixtral_b4" / "003_007.npz", data=np.array([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=np.int64))
