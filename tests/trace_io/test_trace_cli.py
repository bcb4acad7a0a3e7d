"""``stepsim trace import | inspect | synth`` through stepsim.cli.main, with exact outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepsim.cli import main
from stepsim.trace_io import expert_counts, read_trace, routing_matrix
from stepsim.trace_io.make_bundled import DATA_DIR


def run(capsys, *argv):
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def inspect_json(capsys, *argv):
    code, out, err = run(capsys, "trace", "inspect", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_inspect_mixtral_json(shared_traces, capsys):
    src = shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz"
    s = inspect_json(capsys, src)
    assert s["tokens"] == 64
    assert s["rows"] == 64
    assert s["batch_size"] == 64
    assert s["top_k"] == 2
    assert s["num_experts"] == 8
    assert s["expert_counts"] == [13, 10, 17, 14, 17, 10, 24, 23]
    assert s["idle_experts"] == 0
    assert s["idle_expert_ids"] == []
    assert s["assignments"] == 128
    assert s["model"] == "mixtral"
    assert s["kind"] == "expert_routing"
    assert s["source"] == str(src)


def test_inspect_qwen_json(shared_traces, capsys):
    s = inspect_json(capsys, shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")
    assert (s["tokens"], s["top_k"], s["num_experts"]) == (64, 8, 128)
    assert len(s["expert_counts"]) == 128 and sum(s["expert_counts"]) == 512
    assert s["idle_experts"] == 68
    assert len(s["idle_expert_ids"]) == 68
    assert s["max_count"] == 42
    assert s["active_experts"] == 60


def test_inspect_kv_json(shared_traces, capsys):
    s = inspect_json(capsys, shared_traces / "kv_lengths" / "b16" / "conv_stdev0987_3349_3364.npy")
    assert s["kind"] == "decode_batches"
    assert (s["batches"], s["batch_size"]) == (1, 16)
    kv = s["kv_lengths"]
    assert (kv["count"], kv["min"], kv["max"], kv["sum"]) == (16, 181, 4079, 19051)
    assert int(kv["stdev"]) == 987
    assert kv["stdev"] == pytest.approx(987.1284089890906, rel=1e-12)
    assert (s["kv_tiles"]["sum"], s["kv_tiles"]["max"]) == (604, 128)
    assert s["metadata"]["stdev_label"] == "987"
    assert (s["metadata"]["window_start"], s["metadata"]["window_end"]) == ("3349", "3364")


def test_inspect_text(shared_traces, capsys):
    code, out, _ = run(capsys, "trace", "inspect", shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz")
    assert code == 0
    assert "expert counts: 13 10 17 14 17 10 24 23" in out
    assert "idle experts: 0" in out
    assert "num_experts: 8  top_k: 2" in out


@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_import_npz(shared_traces, tmp_path, capsys, suffix):
    src = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    out = tmp_path / f"qwen{suffix}"
    code, stdout, _ = run(capsys, "trace", "import", src, "--out", out)
    assert code == 0
    assert stdout == f"wrote {out}: expert_routing trace, 64 rows (from npz {src})\n"
    t = read_trace(out)
    with np.load(src) as z:
        assert np.array_equal(routing_matrix(t), z["data"])
    s = inspect_json(capsys, out)
    assert (s["idle_experts"], s["max_count"]) == (68, 42)


def test_import_npz_with_explicit_format_and_experts(shared_traces, tmp_path, capsys):
    src = shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz"
    out = tmp_path / "m.arrow"
    code, _, err = run(capsys, "trace", "import", src, "--format", "npz", "--num-experts", 8, "--model", "Mixtral8x7b",
                       "--out", out)  # fmt: skip
    assert code == 0, err
    assert read_trace(out).schema.metadata[b"model"] == b"Mixtral8x7b"


def test_import_azure_csv(conv_csv, tmp_path, capsys):
    out = tmp_path / "conv.parquet"
    code, stdout, _ = run(capsys, "trace", "import", conv_csv, "--format", "azure-csv", "--out", out)
    assert code == 0
    assert stdout == f"wrote {out}: requests trace, 19366 rows (from azure-csv {conv_csv})\n"
    s = inspect_json(capsys, out)
    assert s["requests"] == 19_366
    assert (s["context_tokens"]["min"], s["context_tokens"]["max"]) == (2, 14050)
    assert s["context_tokens"]["sum"] == 22_361_870  # checked with the csv module


def test_synth_routing_cli_deterministic(tmp_path, capsys):
    a, b = tmp_path / "a.arrow", tmp_path / "b.arrow"
    for out in (a, b):
        code, stdout, _ = run(capsys, "trace", "synth", "routing", "--model", "qwen", "--tokens", 64, "--seed", 7,
                              "--skew", "zipf", "--alpha", "1.5", "--out", out)  # fmt: skip
        assert code == 0
        assert stdout == f"wrote {out}: synthetic routing, 64 tokens, 128 experts, top-8, seed 7\n"
    assert a.read_bytes() == b.read_bytes()
    s = inspect_json(capsys, a)
    assert (s["tokens"], s["top_k"], s["num_experts"]) == (64, 8, 128)
    assert s["metadata"]["skew"] == "zipf" and s["metadata"]["seed"] == "7"


def test_synth_kv_cli(tmp_path, capsys):
    out = tmp_path / "kv.parquet"
    code, stdout, _ = run(capsys, "trace", "synth", "kv", "--batch", 16, "--batches", 2, "--seed", 1, "--out", out)
    assert code == 0
    assert stdout == f"wrote {out}: synthetic KV lengths, 2 batch(es) of 16, seed 1\n"
    s = inspect_json(capsys, out)
    assert (s["batches"], s["batch_size"], s["kv_lengths"]["count"]) == (2, 16, 32)


def test_synth_kv_from_azure(conv_csv, tmp_path, capsys):
    out = tmp_path / "kv.arrow"
    code, _, err = run(capsys, "trace", "synth", "kv", "--batch", 64, "--seed", 3, "--distribution", conv_csv,
                       "--out", out)  # fmt: skip
    assert code == 0, err
    t = read_trace(out)
    assert t.schema.metadata[b"distribution"] == b"AzureLLMInferenceTrace_conv.csv"


def test_inspect_bundled(capsys):
    s = inspect_json(capsys, DATA_DIR / "synthetic_routing_mixtral_b64.arrow")
    t = read_trace(DATA_DIR / "synthetic_routing_mixtral_b64.arrow")
    assert s["expert_counts"] == expert_counts(t).tolist()
    assert (s["tokens"], s["top_k"], s["num_experts"]) == (64, 2, 8)


def test_errors_exit_2_with_message(tmp_path, capsys):
    bad = tmp_path / "mixtral_b4" / "000_001.npz"
    bad.parent.mkdir()
    np.savez(bad, data=np.array([[0, 9]]))
    code, out, err = run(capsys, "trace", "import", bad, "--out", tmp_path / "x.arrow")
    assert code == 2 and out == ""
    assert (
        err == f"stepsim: error: {bad}: row 0, column 'expert_ids': expert id 9 at position 1 is out of range [0, 8)\n"
    )
    assert not (tmp_path / "x.arrow").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["mixtral_b4"]  # no temp file either

    code, _, err = run(capsys, "trace", "import", bad, "--out", tmp_path / "x.csv")
    assert code == 2 and "suffix must be one of" in err

    code, _, err = run(capsys, "trace", "synth", "routing", "--tokens", 10, "--seed", 1, "--out", tmp_path / "r.arrow")
    assert code == 2 and "needs --num-experts and --top-k" in err

    code, _, err = run(capsys, "trace", "inspect", tmp_path / "none.parquet")
    assert code == 2 and err == f"stepsim: error: {tmp_path / 'none.parquet'}: no such file or directory\n"

    code, _, err = run(capsys, "trace", "synth", "kv", "--batch", 0, "--seed", 1, "--out", tmp_path / "k.arrow")
    assert code == 2 and "--batch must be a positive integer, got 0" in err


def test_bare_trace_command_prints_help(capsys):
    code, out, _ = run(capsys, "trace")
    assert code == 1 and "import" in out and "inspect" in out and "synth" in out


def test_import_labels_a_routing_npz_of_any_name_from_iteration_and_layer(tmp_path, capsys):
    """``routing.npz`` imports as iteration/layer 0/0, or as the --iteration / --layer given; a file named
    <iteration>_<layer>.npz takes its labels from the name, and the flags are refused for it."""
    data = np.array([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=np.int64)
    np.savez(tmp_path / "routing.npz", data=data)
    out = tmp_path / "r.parquet"
    for flags, labels in (([], {(0, 0)}), (["--iteration", 3, "--layer", 2], {(3, 2)}), (["--layer", 5], {(0, 5)})):
        code, stdout, err = run(capsys, "trace", "import", tmp_path / "routing.npz", "--model", "mixtral", *flags,
                                "--out", out)
        assert (code, err) == (0, ""), err
        assert stdout == f"wrote {out}: expert_routing trace, 4 rows (from npz {tmp_path / 'routing.npz'})\n"
        table = read_trace(out)
        assert set(zip(table["iteration"].to_pylist(), table["layer"].to_pylist())) == labels
        assert routing_matrix(table).tolist() == data.tolist()
    (tmp_path / "mixtral_b4").mkdir()
    named = tmp_path / "mixtral_b4" / "003_007.npz"
    np.savez(named, data=data)
    assert run(capsys, "trace", "inspect", named, "--layer", 2) == (
        2, "", f"stepsim: error: --layer labels a single routing .npz file whose name is not "
               f"<iteration>_<layer>.npz; {named} is not one\n")
    assert inspect_json(capsys, tmp_path / "routing.npz", "--model", "mixtral", "--iteration", 4)["tokens"] == 4
