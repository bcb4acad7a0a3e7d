"""A cached fast-fidelity calibration is reused only by the code that made it: the key hashes the model's source
(stepsim/serve/fast.py) and the timing-model version beside the run's parts (a calibration cached by an older
fast.py was loaded once and failed with KeyError 'ffn_prefill')."""

from __future__ import annotations

from pathlib import Path

from stepsim.serve import calibration_cache as cache


def test_the_key_changes_with_the_models_source_and_the_timing_model(monkeypatch):
    parts = {"model": "m", "requests": "r"}
    key = cache.calibration_key(parts)
    assert cache.calibration_key(dict(parts)) == key
    monkeypatch.setattr(cache, "_MODEL_SOURCE", "0" * 64)
    changed_source = cache.calibration_key(parts)
    monkeypatch.undo()
    monkeypatch.setattr(cache, "TIMING_MODEL_VERSION", cache.TIMING_MODEL_VERSION + 1)
    changed_timing = cache.calibration_key(parts)
    assert len({key, changed_source, changed_timing}) == 3


def test_the_key_changes_with_each_source_of_the_exact_pricing_it_fits(monkeypatch):
    """The exact provider's modules and the builders of the layers it simulates are in the key: a calibration
    fitted to an older exact pricing is never reused (the fitted model's own files were the only ones before)."""
    import stepsim.serve.exact as exact

    # models/layers.py: a layer group's attention weights and an MLA group's matrices (since 2026-11-26)
    assert {"serve/exact.py", "workloads/moe/build.py", "serve/ffn_points.py", "models/layers.py"} <= set(
        cache.PRICING_SOURCES)
    base = cache._pricing_source()
    real = cache.file_sha256
    seen = set()
    for name in cache.PRICING_SOURCES:
        monkeypatch.setattr(cache, "file_sha256", lambda p, name=name: "x" if str(p).endswith(name) else real(p))
        seen.add(cache._pricing_source())
    assert base not in seen and len(seen) == len(cache.PRICING_SOURCES)
    assert Path(exact.__file__) == Path(cache.__file__).parents[1] / "serve/exact.py"  # the names are the package's


def test_a_model_file_calibrates_under_one_key_wherever_it_lies(tmp_path):
    """The key holds the model's dimensions, not its name or source, which are the file's path for a user's model:
    the stored calibrations of tests/calibration_seeds were never found in a fresh clone (another path)."""
    import json
    import shutil
    from dataclasses import dataclass
    from pathlib import Path
    from types import SimpleNamespace

    from stepsim.base.hardware import PRESETS
    from stepsim.models.presets import resolve_model
    from stepsim.serve.api import fast_key_parts

    @dataclass
    class Config:
        policy: str = "vllm"

    example = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-4layers.json"
    models = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        models.append(resolve_model(str(shutil.copy(example, tmp_path / folder / example.name))))
    assert models[0].name != models[1].name and models[0].source != models[1].source
    requests = tmp_path / "r.csv"
    requests.write_text("x\n")
    keys = [cache.calibration_key(fast_key_parts(
        m, PRESETS["sn40l"], 4096, SimpleNamespace(num_blocks=10), Config(), SimpleNamespace(vocab_size=7), 0,
        requests, None, None, None, None, None, None, "paper", None)) for m in models]
    assert keys[0] == keys[1]
    other = json.loads(example.read_text())
    other["num_hidden_layers"] = 3
    (tmp_path / "c.json").write_text(json.dumps(other))
    changed = resolve_model(str(tmp_path / "c.json"))
    assert cache.calibration_key(fast_key_parts(
        changed, PRESETS["sn40l"], 4096, SimpleNamespace(num_blocks=10), Config(), SimpleNamespace(vocab_size=7), 0,
        requests, None, None, None, None, None, None, "paper", None)) != keys[0]
