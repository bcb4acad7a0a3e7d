"""Capacity planning (``stepsim plan``): the deployment with the most goodput per chip under an SLO.

Pieces: :mod:`~stepsim.plan.space` (the deployments), :mod:`~stepsim.plan.pricing` (one fast calibration per
replica shape; the steps' time floors), :mod:`~stepsim.plan.replicas` (routers), :mod:`~stepsim.plan.evaluate`
(a deployment at a rate, served through :func:`stepsim.serve`), :mod:`~stepsim.plan.search` (the rate search,
the bounds, the front), :mod:`~stepsim.plan.output` (the files), :mod:`~stepsim.plan.api` (:func:`plan`); the
command is :mod:`stepsim.cli.plan`. Rules: docs/plan.md.

>>> import stepsim
>>> p = stepsim.plan("qwen3-30b-a3b", "trace.csv", slo="ttft=2s,tpot=100ms", max_chips=4)   # doctest: +SKIP
>>> p.summary["recommended"]["deployment"]                                                 # doctest: +SKIP
"""

import sys
import types

from stepsim.plan.api import PlanResult, plan

__all__ = ["PlanResult", "plan"]


class _CallableModule(types.ModuleType):
    """``stepsim.plan(...)`` is :func:`plan`: the package and the function share the name."""

    def __call__(self, *args, **kwargs) -> PlanResult:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
