"""Serving-level replay (``stepsim serve``): a request trace through a vLLM / Orca / Sarathi scheduler.

Pieces, one purpose each: :mod:`~stepsim.serve.memory` (weights and KV bytes of a model),
:mod:`~stepsim.serve.kv_cache` (the paged KV cache's size), :mod:`~stepsim.serve.scheduler` (the batch
policies), :mod:`~stepsim.serve.latency` (iteration-latency providers), :mod:`~stepsim.serve.replay` (the event
loop), :mod:`~stepsim.serve.metrics` (vLLM's benchmark metrics), :mod:`~stepsim.serve.output` (the files),
:mod:`~stepsim.serve.layers` (a serving layer's graphs, built once per shape and rebound per step),
:mod:`~stepsim.serve.routing` (per-token expert routing: replayed or the fitted synthetic model),
:mod:`~stepsim.serve.exact` and :mod:`~stepsim.serve.fast` (the engine-backed providers),
:mod:`~stepsim.serve.figures` (the latency CDFs), :mod:`~stepsim.serve.timeline` (the Perfetto trace),
:mod:`~stepsim.serve.dask_layers` (a step's layers on Dask), :mod:`~stepsim.serve.sweep` (serving sweeps through
``stepsim sweep``), :mod:`~stepsim.serve.api` (:func:`serve`); the command is :mod:`stepsim.cli.serve`. Rules and sources: docs/serving.md.

>>> import stepsim
>>> r = stepsim.serve("qwen3-30b-a3b", "trace.csv", iteration_latency=0.02)   # doctest: +SKIP
>>> r.summary["ttft_s"]["p99"]                                                 # doctest: +SKIP
"""

import sys
import types

from stepsim.serve.api import ServeResult, serve

__all__ = ["ServeResult", "serve"]


class _CallableModule(types.ModuleType):
    """``stepsim.serve(...)`` is :func:`serve`: the package and the function share the name."""

    def __call__(self, *args, **kwargs) -> ServeResult:
        return serve(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
