"""Typed errors of ``stepsim reproduce`` (both derive from :class:`~stepsim.base.errors.StepsimError`)."""

from __future__ import annotations

from stepsim.base.errors import ConfigError, SimulationError


class TracesLayoutError(ConfigError):
    """The ``--traces`` folder is missing or not laid out like ``../shared/traces``; the message names the path.

    Expected layout: ``expert_routing/<mixtral|qwen>_b<B>/*.npz`` (routing of one decoding batch of B tokens per
    file) and ``kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy`` (KV lengths of a B-request window).
    """


class RunFailedError(SimulationError):
    """One configuration of an experiment failed; the message names the experiment point and the cause."""
