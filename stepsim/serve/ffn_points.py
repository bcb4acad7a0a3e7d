"""An FFN bucket's simulated points for fast mode on mapped layers (:func:`stepsim.serve.fast_mapped.bucket_estimate`):
the engine cycles of the mapped FFN layer at one token count under its bucket's schedule, on each of the mapper's
representative routings of that many tokens (:func:`stepsim.mapping.kinds.ffn.ffn_samples` of them), built fresh as
the exact provider builds the bucket (:meth:`stepsim.serve.layers.LayerRunner.fresh_cycles`).

Each point is memoised per process and stored in the mapping cache's :data:`FOLDER`
(:mod:`stepsim.serve.stored_costs`): a plan's worker processes and a test suite's each priced the same buckets
again (test_plan_layer_list: 33 of its 100 s, profiled). The material says what the cycles were simulated for (the
dimensions, hardware and system, so tests/mapping_seeds/refresh.py can simulate a seed again) and depends on the
key of the bucket's schedule (its mapper's and builders' sources, the timing model) and on the sources that build
and run the layer here (:data:`SOURCES`)."""

from __future__ import annotations

import functools
from pathlib import Path

#: the mapping cache's subfolder of FFN points
FOLDER = "ffn-points"
#: the modules that build and run a point's layer besides the schedule's (in its key): this one and the serving
#: layers' (:class:`~stepsim.serve.layers.LayerRunner`)
SOURCES = ("ffn_points.py", "layers.py")

_POINTS: dict = {}


@functools.cache
def _source() -> str:
    from stepsim.base.files import file_sha256, stable_hash

    return stable_hash([file_sha256(Path(__file__).parent / name) for name in SOURCES])


def point_material(tokens: int, dims, hardware, system=None) -> dict:
    """What the FFN point of ``tokens`` tokens of ``dims`` (an :class:`~stepsim.models.presets.MoEModel`; a dense
    FFN as one expert) on ``hardware`` (its experts over ``system``'s chips, when given) depends on: the request
    itself, the knobs its layers are built with (those :func:`stepsim.mapping.schedule_for` or the expert-parallel
    search give now: a test that injects other schedules never meets a point of the real ones), the key of the
    bucket's schedule (the mapper's and builders' sources, the timing model) and :data:`SOURCES`."""
    from stepsim.base.files import stable_hash
    from stepsim.mapping.kinds.ffn import ffn_samples
    from stepsim.mapping.mapper import bucket, dims_fields, key_material

    b = bucket(tokens)
    if system is None:
        from stepsim.mapping import schedule_for

        knobs, schedule = schedule_for("ffn", b, dims, hardware).knobs, key_material("ffn", b, dims, hardware)
    else:
        from stepsim.mapping.expert_parallel import search_knobs, search_material

        knobs, schedule = search_knobs(b, dims, system, hardware), search_material(b, dims, system, hardware)
    return {"what": "ffn point", "tokens": int(tokens), "samples": ffn_samples(tokens),
            "dims": dims_fields(dims), "hardware": hardware.values(), "hardware_explicit": list(hardware.explicit),
            "system": None if system is None else system.name, "knobs": dict(knobs),
            "schedule_key": stable_hash(schedule), "source": _source()}


def point_cycles(tokens: int, dims, hardware, system=None) -> tuple[int, ...]:
    """Engine cycles of the FFN layer (module docstring) on each representative routing of ``tokens`` tokens, in
    sample order; stored (:data:`FOLDER`) and memoised."""
    from stepsim.mapping.kinds.ffn import ffn_samples
    from stepsim.serve.stored_costs import stored_cost

    material = point_material(tokens, dims, hardware, system)
    key = repr(material)
    if key not in _POINTS:
        _POINTS[key] = stored_cost(FOLDER, material, "ffn point", ffn_samples(tokens),
                                   lambda: simulate_point(tokens, dims, hardware, system))
    return _POINTS[key]


def simulate_point(tokens: int, dims, hardware, system=None) -> list[int]:
    """:func:`point_cycles` simulated: each routing's layer built fresh, checked and run by a
    :class:`~stepsim.serve.layers.LayerRunner` of a model whose FFN is ``dims`` (the runner reads nothing else of
    the model to build an FFN)."""
    from stepsim.mapping.kinds.ffn import ffn_routing, ffn_samples
    from stepsim.serve.layers import KV_TILE, LayerRunner, LayerSpec

    runner = LayerRunner(LayerSpec(ffn_only_model(dims), hardware, KV_TILE, system, "auto"))
    return [runner.fresh_cycles("ffn", ffn_routing(tokens, dims, s)) for s in range(ffn_samples(tokens))]


def ffn_only_model(dims):
    """A one-layer :class:`~stepsim.models.presets.ModelConfig` whose FFN (``ffn_model``) equals ``dims``."""
    from stepsim.models.presets import ModelConfig

    return ModelConfig(dims.name, source="ffn point", model_type="ffn", hidden=dims.hidden, layers=1, heads=1,
                       kv_heads=1, head_dim=dims.hidden, experts=dims.experts, top_k=dims.top_k,
                       expert_intermediate=dims.intermediate, shared_experts=int(dims.shared_intermediate > 0),
                       shared_intermediate=dims.shared_intermediate)
