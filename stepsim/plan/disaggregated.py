"""Disaggregated deployments in ``stepsim plan`` (issue 42): a replica of ``P + D`` chips whose first ``P`` chips
prefill and next ``D`` decode, the KV cache moved over the replica's system links (:mod:`stepsim.serve.disaggregated`;
``stepsim serve --disaggregate P:D``).

* The space's ``disaggregated`` key lists the splits ``[P, D]`` (:func:`check_splits`); :mod:`stepsim.plan.space`
  enumerates them beside the colocated deployments (``Deployment.disaggregate``).
* A replica is served by :func:`stepsim.serve.disaggregated_serve.serve_disaggregated` on the system preset of
  ``P + D`` chips, each pool priced by the calibrated fast provider of its own shape (hardware, ``P`` or ``D``
  chips), the one colocated replicas of that many chips use (:func:`pool_pricer`: calibrated here when the plan's
  colocated space has no such shape). The shape of ``P + D`` chips is not calibrated for it (only a colocated
  deployment of ``P + D`` chips a replica calibrates it).
* The rate bound of :mod:`stepsim.plan.search` stays sound on ``P + D`` chips: the pools run side by side, but a
  pool of ``k`` chips takes at least ``(P + D) / k`` times the ``P + D``-chip floor of its own steps, so the
  replica's duration is at least the ``P + D``-chip floor of all its steps; the transfers only add time.
"""

from __future__ import annotations

from stepsim.base.errors import ConfigError


def check_splits(splits, where: str, systems: dict) -> list:
    """The space's ``disaggregated`` value: a list of distinct ``[P, D]`` pairs of integers >= 1 whose sum is a
    replica size with a system (``systems``: chips -> preset); one line naming ``where`` otherwise."""
    ok = isinstance(splits, list) and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                                    for x in s) for s in splits)
    if not ok:
        raise ConfigError(f"{where}: disaggregated must be a list of [P, D] pairs (prefill and decode chips, each an "
                          f"integer >= 1), got {splits!r}")
    for p, d in splits:
        if p + d not in systems:
            raise ConfigError(f"{where}: disaggregated [{p}, {d}]: a replica of {p + d} chips has no system (sizes "
                              f"{', '.join(map(str, systems))})")
    if len({tuple(s) for s in splits}) != len(splits):
        raise ConfigError(f"{where}: disaggregated lists a split twice: {splits!r}")
    return splits


def serve_flags(dep) -> list[str]:
    """The ``stepsim serve`` flags of a deployment's split (none when colocated)."""
    return ["--disaggregate", f"{dep.disaggregate[0]}:{dep.disaggregate[1]}"] if dep.disaggregate else []


def split_columns(dep) -> dict:
    """A deployment's split as deployments.parquet has it: ``prefill_chips`` and ``decode_chips`` per replica, both
    None for a colocated deployment."""
    p, d = dep.disaggregate if dep.disaggregate else (None, None)
    return {"prefill_chips": p, "decode_chips": d}


def pool_pricer(evaluator, hardware: str, chips: int):
    """The fast pricer of a pool of ``chips`` chips of ``hardware``: the plan's colocated one of that shape, else one
    calibrated now on the plan's reference run (as the plan calibrates its shapes) and kept for the next."""
    from stepsim.plan.pricing import ShapePricer

    key = (hardware, chips)
    if key not in evaluator.pricers:
        systems = {1: None, 2: "ring-2", 4: "ring-4", 8: "sn40l-8", 16: "sn40l-16"}
        if chips not in systems:
            raise ConfigError(f"a disaggregated pool of {chips} chips: colocated serving has no system of that size "
                              f"to calibrate it on (sizes {', '.join(map(str, systems))})")
        from stepsim.models.presets import resolve_model
        from stepsim.serve.api import default_calibration_cache

        cache = getattr(evaluator, "calibration_cache", None) or default_calibration_cache()
        pricer = ShapePricer(evaluator.model_arg, resolve_model(evaluator.model_arg), hardware, chips, systems[chips],
                             cache)
        reference = getattr(evaluator, "reference_file", None) or evaluator.folder / "reference.parquet"
        pricer.calibrate(reference, None)
        evaluator.pricers[key] = pricer
    return evaluator.pricers[key]


def serve_replica(evaluator, dep, requests, stop=None):
    """One disaggregated replica of ``dep`` serving ``requests`` (a trace's path or a RequestTrace in memory), each
    pool priced by its shape's calibrated provider (:func:`pool_pricer`); ``stop``: the replay's
    :class:`~stepsim.serve.replay_stop.StopRule` (:mod:`stepsim.serve.disaggregated`, "Early stop")."""
    from stepsim.serve.disaggregated_serve import serve_disaggregated

    p, d = dep.disaggregate
    providers = (pool_pricer(evaluator, dep.hardware, p).provider(), pool_pricer(evaluator, dep.hardware, d).provider())
    return serve_disaggregated(evaluator.model_arg, requests, disaggregate=dep.disaggregate, system=dep.system,
                               hardware=dep.hardware, providers=providers, stop=stop,
                               **dep.scheduler.serve_kwargs())


def verify_replica(dep, model, path, slo, cache):
    """The recommended disaggregated replica re-served with ``--fidelity fast`` (each pool its own calibration, on
    the layers serve's default gives its shape, as the plan priced it: :func:`pool_pricer`)."""
    from stepsim.serve.disaggregated_serve import serve_disaggregated

    return serve_disaggregated(model, path, disaggregate=dep.disaggregate, system=dep.system, fidelity="fast",
                               schedule=None, slo=slo, hardware=dep.hardware, calibration_cache=cache,
                               **dep.scheduler.serve_kwargs())
