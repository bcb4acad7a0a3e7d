"""A cached fast-fidelity calibration is reused only by the code that made it: the key hashes the model's source
(stepsim/serve/fast.py) and the timing-model version beside the run's parts (a calibration cached by an older
fast.py was loaded once and failed with KeyError 'ffn_prefill')."""

from __future__ import annotations

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

    assert "serve/exact.py" in cache.PRICING_SOURCES and "workloads/moe/build.py" in cache.PRICING_SOURCES
    base = cache._pricing_source()
    real = cache.file_sha256
    seen = set()
    for name in cache.PRICING_SOURCES:
        monkeypatch.setattr(cache, "file_sha256", lambda p, name=name: "x" if str(p).endswith(name) else real(p))
        seen.add(cache._pricing_source())
    assert base not in seen and len(seen) == len(cache.PRICING_SOURCES)
    assert str(exact.__file__).endswith(cache.PRICING_SOURCES[3])
