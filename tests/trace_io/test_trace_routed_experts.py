"""``stepsim trace import-routed``: serving engines' routed-expert arrays [tokens, layers, top_k] to routing traces."""

import numpy as np
import pyarrow as pa
import pytest
from safetensors.numpy import save_file

from stepsim.base.errors import ConfigError, TraceError, TraceSchemaError, TraceValueError
from stepsim.cli import main
from stepsim.models.presets import moe_model
from stepsim.results.records import run_config
from stepsim.trace_io.load import load_routing
from stepsim.trace_io.readers import read_trace, routing_matrix
from stepsim.trace_io.serving import import_routed_experts, synthetic_routed_experts
from stepsim.workloads.moe.build import build_moe

TOKENS, LAYERS, E, K = 64, 3, 8, 2


@pytest.fixture(scope="module")
def routed():
    return synthetic_routed_experts(TOKENS, LAYERS, E, K, seed=11)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_synthetic_array_is_seeded_and_valid(routed):
    assert routed.shape == (TOKENS, LAYERS, K) and routed.dtype == np.int32
    assert np.array_equal(routed, synthetic_routed_experts(TOKENS, LAYERS, E, K, seed=11))
    assert not np.array_equal(routed, synthetic_routed_experts(TOKENS, LAYERS, E, K, seed=12))
    assert routed.min() >= 0 and routed.max() < E
    assert (np.sort(routed, axis=2)[:, :, 1:] != np.sort(routed, axis=2)[:, :, :-1]).all()


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".safetensors"])
@pytest.mark.parametrize("out_suffix", [".arrow", ".parquet"])
def test_round_trip_one_batch_per_layer(tmp_path, routed, suffix, out_suffix):
    src = tmp_path / f"routed{suffix}"
    if suffix == ".npy":
        np.save(src, routed.astype(np.int64))
    elif suffix == ".npz":
        np.savez(src, routed_experts=routed)
    else:
        save_file({"routed_experts": routed}, str(src))
    out = tmp_path / f"trace{out_suffix}"
    assert import_routed_experts(src, out, model="mixtral") == (TOKENS * LAYERS, LAYERS, LAYERS)
    table = read_trace(out)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert {k: meta[k] for k in ("model", "num_experts", "top_k", "source", "layout")} == {
        "model": "mixtral", "num_experts": "8", "top_k": "2", "source": src.name, "layout": "tokens,layers,top_k"}
    assert table.column("iteration").to_pylist() == [0] * (TOKENS * LAYERS)
    assert table.column("layer").to_pylist() == [layer for layer in range(LAYERS) for _ in range(TOKENS)]
    assert table.column("token").to_pylist() == list(range(TOKENS)) * LAYERS
    for layer in range(LAYERS):
        assert np.array_equal(load_routing(out, E, layer=layer), routed[:, layer, :])
    # the whole trace, layer by layer, is the array again
    back = routing_matrix(table).reshape(LAYERS, TOKENS, K).transpose(1, 0, 2)
    assert np.array_equal(back, routed)


def test_iteration_array_gives_one_batch_per_iteration_and_layer(tmp_path, routed):
    steps = np.array([2, 0, 1] * 21 + [2], dtype=np.int64)  # tokens of 3 decode steps, interleaved
    src = tmp_path / "routed.safetensors"
    save_file({"routed_experts": routed, "step": steps}, str(src))
    out = tmp_path / "trace.arrow"
    assert import_routed_experts(src, out, iteration_key="step", num_experts=E) == (TOKENS * LAYERS, 3 * LAYERS,
                                                                                      LAYERS)
    table = read_trace(out)
    groups = list(zip(table.column("iteration").to_pylist(), table.column("layer").to_pylist()))
    assert sorted(set(groups)) == [(it, layer) for it in range(3) for layer in range(LAYERS)]
    assert groups == sorted(groups)  # ascending iteration, then layer
    for it in range(3):
        rows = np.flatnonzero(steps == it)
        for layer in range(LAYERS):
            assert np.array_equal(load_routing(out, E, iteration=it, layer=layer), routed[rows, layer, :])
    with pytest.raises(ConfigError, match=r"holds 9 \(iteration, layer\) batches"):
        load_routing(out, E)


def test_imported_layer_runs_as_the_moe_workload(tmp_path, routed):
    np.save(tmp_path / "routed.npy", routed)
    out = tmp_path / "trace.arrow"
    import_routed_experts(tmp_path / "routed.npy", out, model="mixtral-8x7b")
    row = run_config({"workload": "moe", "model": "mixtral", "trace": str(out), "layer": 1, "tiling": "dynamic"}).row
    direct = build_moe(moe_model("mixtral-8x7b"), routed[:, 1, :], tiling="dynamic").metrics()
    assert row["off_chip_bytes"] == direct["off_chip_bytes"] and row["on_chip_bytes"] == direct["on_chip_bytes"]
    assert row["layer"] == 1 and row["model"] == "mixtral-8x7b"


def test_cli_import_routed(tmp_path, capsys, routed):
    src = tmp_path / "routed.npz"
    np.savez(src, routed_experts=routed, step=np.zeros(TOKENS, dtype=np.int32))
    out = tmp_path / "trace.parquet"
    code, stdout, err = run(capsys, "trace", "import-routed", src, "--model", "mixtral", "--iteration-key", "step",
                            "--out", out)
    assert (code, err) == (0, "")
    assert stdout == (f"wrote {out}: routing trace, 192 rows, 3 layer(s), 3 (iteration, layer) batch(es) "
                      f"(from {src})\n")
    code, stdout, err = run(capsys, "metrics", "moe", "--model", "mixtral", "--trace", out, "--iteration", 0,
                            "--layer", 2, "--tiling", "dynamic", "--json")
    assert code == 0, err
    code, stdout, err = run(capsys, "trace", "import-routed", src, "--iteration", 5, "--iteration-key", "step",
                            "--out", out, "--num-experts", 8)
    assert (code, stdout) == (2, "")
    assert err == ("stepsim: error: --iteration labels a file without an iteration array; it cannot be combined "
                   "with --iteration-key\n")
    code, stdout, err = run(capsys, "trace", "import-routed", src, "--out", out, "--model", "qwen")
    assert (code, stdout) == (2, "")
    assert err == (f"stepsim: error: {src}: array 'routed_experts' has top_k = 2 (last axis), but model 'qwen' "
                   "routes each token to 8 experts\n")


def _bad(tmp_path, array, name="routed.npy"):
    path = tmp_path / name
    np.save(path, array)
    return path


def test_malformed_arrays_name_the_row_and_layer(tmp_path, routed):
    cases = []
    wrong_rank = routed[:, 0, :]
    cases.append((wrong_rank, TraceSchemaError, "array 'array' has shape [64, 2], expected 3 axes [tokens, layers, "
                                                "top_k]"))
    cases.append((routed.astype(np.float32), TraceSchemaError,
                  "array 'array' has dtype float32, expected integer expert ids"))
    cases.append((routed.astype(bool), TraceSchemaError, "array 'array' has dtype bool, expected integer expert ids"))
    cases.append((np.zeros((0, 3, 2), dtype=np.int64), TraceSchemaError,
                  "array 'array' has shape [0, 3, 2]: an empty axis (expected [tokens, layers, top_k], each at "
                  "least 1)"))
    out_of_range = routed.copy()
    out_of_range[37, 2, 1] = 8
    out_of_range[40, 0, 0] = 9  # later in row-major order: the first one is reported
    cases.append((out_of_range, TraceValueError, "array 'array': row 37, layer 2: expert id 8 (slot 1) outside 0..7"))
    negative = routed.copy()
    negative[5, 1, 0] = -1
    cases.append((negative, TraceValueError, "array 'array': row 5, layer 1: expert id -1 (slot 0) outside 0..7"))
    dup = routed.copy()
    dup[12, 1] = [3, 3]
    cases.append((dup, TraceValueError, "array 'array': row 12, layer 1: expert 3 appears twice in the token's top-k "
                                        "[3, 3]"))
    for array, error, message in cases:
        path = _bad(tmp_path, array)
        with pytest.raises(error) as err:
            import_routed_experts(path, tmp_path / "out.arrow", num_experts=E)
        assert str(err.value) == f"{path}: {message}"
        assert not (tmp_path / "out.arrow").exists()  # nothing written, not even a partial file
        assert [p.name for p in tmp_path.iterdir()] == ["routed.npy"]


def test_bad_files_and_options(tmp_path, capsys, routed):
    out = tmp_path / "out.arrow"
    path = _bad(tmp_path, routed)
    with pytest.raises(ConfigError) as err:
        import_routed_experts(path, out)
    assert str(err.value) == (f"{path}: array 'array': the number of experts is unknown; give --num-experts or "
                              "--model (a preset, alias or config.json)")
    with pytest.raises(TraceSchemaError) as err:
        import_routed_experts(path, out, model="qwen")
    assert str(err.value) == (f"{path}: array 'array' has top_k = 2 (last axis), but model 'qwen' routes each token "
                              "to 8 experts")
    with pytest.raises(ConfigError) as err:
        import_routed_experts(path, out, model="mixtral", num_experts=16)
    assert str(err.value) == "num_experts = 16 conflicts with model 'mixtral' (8 experts)"
    with pytest.raises(ConfigError) as err:
        import_routed_experts(path, out, num_experts=E, iteration_key="step")
    assert str(err.value) == (f"{path}: a .npy file holds one array; put the iteration array beside the routed "
                              "experts in a .npz or .safetensors file")
    npz = tmp_path / "two.npz"
    np.savez(npz, a=routed, b=routed)
    with pytest.raises(TraceSchemaError) as err:
        import_routed_experts(npz, out, num_experts=E)
    assert str(err.value) == f"{npz}: holds several arrays (a, b); name the routed-experts one with --key"
    with pytest.raises(TraceSchemaError) as err:
        import_routed_experts(npz, out, num_experts=E, key="c")
    assert str(err.value) == f"{npz}: no array 'c' (arrays: a, b)"
    np.savez(npz, routed_experts=routed, step=np.zeros(TOKENS - 1, dtype=np.int32))
    with pytest.raises(TraceSchemaError) as err:
        import_routed_experts(npz, out, num_experts=E, iteration_key="step")
    assert str(err.value) == f"{npz}: array 'step' has shape [63], expected [64] (one iteration per token row)"
    steps = np.zeros(TOKENS, dtype=np.int32)
    steps[9] = -2
    np.savez(npz, routed_experts=routed, step=steps)
    with pytest.raises(TraceValueError) as err:
        import_routed_experts(npz, out, num_experts=E, iteration_key="step")
    assert str(err.value) == f"{npz}: array 'step': row 9: iteration -2 outside 0..2147483647"
    text = tmp_path / "text.safetensors"
    text.write_text("not a safetensors file")
    with pytest.raises(TraceError, match=rf"^{text}: cannot read safetensors file: "):
        import_routed_experts(text, out, num_experts=E)
    with pytest.raises(TraceError) as err:
        import_routed_experts(tmp_path / "routed.pt", out, num_experts=E)
    assert str(err.value) == (f"{tmp_path / 'routed.pt'}: routed-experts arrays are read from .npy, .npz, "
                              ".safetensors files, not '.pt'")
    with pytest.raises(ConfigError) as err:
        import_routed_experts(path, tmp_path / "out.csv", num_experts=E)
    assert str(err.value).startswith(f"output {str(tmp_path / 'out.csv')!r}: suffix must be one of")
    assert not out.exists()
    high = routed.copy()
    high[0, 0] = [1, 5]
    path = _bad(tmp_path, high)
    code, stdout, err = run(capsys, "trace", "import-routed", path, "--num-experts", 4, "--out", out)
    assert (code, stdout) == (2, "")
    assert err == f"stepsim: error: {path}: array 'array': row 0, layer 0: expert id 5 (slot 1) outside 0..3\n"


def test_arrow_schema_is_the_routing_schema(tmp_path, routed):
    np.save(tmp_path / "routed.npy", routed)
    out = tmp_path / "t.arrow"
    import_routed_experts(tmp_path / "routed.npy", out, num_experts=E)
    with pa.OSFile(str(out)) as f:
        schema = pa.ipc.open_file(f).schema
    assert [(f.name, str(f.type)) for f in schema] == [
        ("iteration", "int32"), ("layer", "int32"), ("token", "int32"), ("expert_ids", "fixed_size_list<item: int16>[2]")]
    assert schema.metadata[b"stepsim.kind"] == b"expert_routing" and b"model" not in schema.metadata
