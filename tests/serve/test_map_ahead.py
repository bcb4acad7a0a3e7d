"""The exact provider's workers map a step's new buckets once each, before its pieces run (stepsim/serve/map_ahead.py):
which buckets a step needs, which of them nothing holds yet, and that each is mapped once, FFN first, its schedule
kept in the parent. The mapper itself is replaced by a recorder (its search is tests/mapping's business), and the
pool by one that runs each job at once in this process."""

from __future__ import annotations

import json
from concurrent.futures import Future

import pytest

from stepsim.base.hardware import PRESETS
from stepsim.mapping import mapper, projection
from stepsim.mapping.schedule import Schedule
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import EngineLatency
from stepsim.serve.latency import IterationBatch
from stepsim.serve.map_ahead import map_ahead, missing, step_jobs

#: a dense model of 2 KV heads (4 query heads of 32): q/k/v 128 x 256, o 128 x 128, LM head 128 x 1,000
TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000,
        "max_position_embeddings": 2048}
#: a 40-token chunk after 20 cached, a 3-token one after 62, two decodes (tests/serve/test_layer_use.py's step)
BATCH = IterationBatch([20, 62, 100, 7], [40, 3, 1, 1], 43, 2)
#: its jobs: the decode of 2 requests x 2 heads, the prefill of 128 positions a head, the FFN of 45 tokens (bucket
#: 64), then the q/k/v and o projections at 64 tokens and the LM head at 4 sequences
JOBS = [("layer", "decode", 4), ("layer", "prefill", 128), ("layer", "ffn", 64), ("projection", 64, 128, 256),
        ("projection", 64, 128, 128), ("projection", 4, 128, 1000)]


class _Inline:
    """A pool that runs each job when it is submitted, in this process."""

    def __init__(self):
        self.submitted = []

    def submit(self, fn, *args):
        self.submitted.append(args[0])
        future = Future()
        future.set_result(fn(*args))
        return future


@pytest.fixture
def provider(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mapper, "_MEMO", {})
    monkeypatch.setattr(projection, "_MEMO", {})
    mapped = []

    def layer(kind, size, dims, hardware, *, cache=True):
        mapped.append((kind, size))
        knobs = {"tile_n": 1, "tile_f": 32, "lanes": 1, "regions": 1} if kind == "ffn" else {"regions": 1}
        return Schedule(kind, knobs, cycles=size)

    def proj(tokens, d_in, d_out, hardware, *, cache=True):
        mapped.append((tokens, d_in, d_out))
        return Schedule("projection", {"tile_m": 1, "tile_f": 32, "lanes": 1, "k_parts": 1}, cycles=tokens)

    monkeypatch.setattr(mapper, "map_layer", layer)
    monkeypatch.setattr(projection, "map_projection", proj)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    p = EngineLatency(resolve_model(str(path)), PRESETS["sn40l"], None, max_model_len=2048, vocab=1000,
                      schedule="auto")
    p.mapped = mapped
    return p


def test_a_steps_jobs_are_its_pieces_buckets_and_its_projections(provider):
    tasks, _ = provider.tasks(BATCH)
    assert step_jobs(provider, BATCH, tasks) == JOBS
    assert step_jobs(provider, None, tasks) == JOBS[:3]  # no batch (the fast calibration's pieces): layers only


def test_each_missing_bucket_is_mapped_once_ffn_first_and_kept_in_the_parent(provider, tmp_path):
    tasks, _ = provider.tasks(BATCH)
    pool = _Inline()
    assert map_ahead(provider, BATCH, tasks + tasks, pool) == 6  # the same pieces twice: each bucket once
    assert provider.mapped == [("ffn", 64), (64, 128, 256), (64, 128, 128), (4, 128, 1000), ("prefill", 128),
                               ("decode", 4)]
    assert pool.submitted == [JOBS[2], *JOBS[3:], JOBS[1], JOBS[0]]
    assert len(mapper._MEMO) == 3 and len(projection._MEMO) == 3
    assert map_ahead(provider, BATCH, tasks, pool) == 0 and len(provider.mapped) == 6  # now held: nothing to do


def test_a_bucket_in_the_mapping_cache_is_not_mapped_again(provider, tmp_path):
    tasks, _ = provider.tasks(BATCH)
    model, hardware = provider.model, provider.hardware
    from stepsim.mapping.kinds import layer_dims

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{mapper._key('ffn', 64, layer_dims('ffn', model), hardware)}.json").write_text("{}")
    assert missing(JOBS, model, hardware) == [job for job in JOBS if job != ("layer", "ffn", 64)]
    assert map_ahead(provider, BATCH, tasks, _Inline()) == 5 and ("ffn", 64) not in provider.mapped
