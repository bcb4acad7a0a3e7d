"""The default FIFO depths and hardware choices, and the precedence that picks a run's depth.

FIFO depths are in elements (tiles, selectors, ...) per channel.

* :data:`UNBOUNDED_CHANNEL_DEPTH` (1024): what a depth of ``None`` means everywhere (step-perf's
  ``DEFAULT_CHAN_SIZE``: bounded, not infinite). ``lower`` also uses it as the buffer bound of a Bufferize
  whose shape is dynamic.
* The depth and hardware each paper experiment runs its workload with (SwiGLU validation 1 on ``step-hdl``,
  MoE 2, decode attention 1, the decoder layer and user programs 2, on ``step-eval``) are declared by each kind in
  its registry entry (:data:`stepsim.workloads.kinds.WORKLOAD_CHANNEL_DEPTH`, ``WORKLOAD_HARDWARE``): this base
  module knows no workload.
* :data:`PRESET_CHANNEL_DEPTH`: the ``channel_depth`` field of the hardware presets (``step-eval`` 2,
  ``step-hdl`` 1).

Which default depth a run uses (channels that carry their own override, e.g. a Broadcast's ``fanout_depth``,
keep it) is decided by :func:`resolve_channel_depth`, highest first:

1. an explicit per-run depth: the ``channel_depth`` knob (``--channel-depth``, a sweep key), or
   ``simulate(..., channel_depth=...)`` / ``lower(..., channel_depth=...)``;
2. the hardware's ``channel_depth`` when it was *set* on that hardware (a key of a hardware TOML file, an
   override of :meth:`Hardware.preset`, a constructor value differing from its preset): see
   ``Hardware.explicit``;
3. the workload's own depth (:attr:`Workload.channel_depth`, the paper experiment's);
4. for a bare graph (no workload), the hardware's ``channel_depth`` (its preset's value).

So a preset's own ``channel_depth`` never overrides a workload (decode attention runs 1-deep on ``step-eval``
whose field says 2, as the paper did), while a hardware file that says ``channel_depth = 64`` does.

:data:`TIMING_MODEL_VERSION` is part of every run identity (:func:`stepsim.results.records.run_identity`): bump it in
any change that moves a cycle count, so a sweep re-simulates instead of resuming with results of the older
model.
"""

from __future__ import annotations

from collections.abc import Mapping

#: version of the timing model (engine + lowering); part of every run id. Bump when any cycle count changes.
TIMING_MODEL_VERSION = 1

#: step-perf's DEFAULT_CHAN_SIZE: the depth ``None`` stands for (elements)
UNBOUNDED_CHANNEL_DEPTH = 1024

#: ``channel_depth`` field of each hardware preset (elements)
PRESET_CHANNEL_DEPTH: dict[str, int] = {"step-eval": 2, "step-hdl": 1}


class _Unset:
    """Marker of "not given" where ``None`` already means :data:`UNBOUNDED_CHANNEL_DEPTH`."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


def depth_elements(depth: int | None) -> int:
    """The capacity (elements) a depth stands for: ``depth``, or :data:`UNBOUNDED_CHANNEL_DEPTH` for None."""
    return UNBOUNDED_CHANNEL_DEPTH if depth is None else int(depth)


def resolve_channel_depth(explicit, hardware, workload_depth=UNSET) -> int:
    """The default FIFO depth (elements) of a run, by the precedence in the module docstring.

    Parameters
    ----------
    explicit : int, None or UNSET
        The per-run depth (None = unbounded, 1024); :data:`UNSET` when not given.
    hardware : stepsim.base.hardware.Hardware
        The run's hardware.
    workload_depth : int, None or UNSET
        The workload's own depth (None = 1024); :data:`UNSET` for a bare graph.
    """
    if explicit is not UNSET:
        return depth_elements(explicit)
    if "channel_depth" in hardware.explicit or workload_depth is UNSET:
        return depth_elements(hardware.channel_depth)
    return depth_elements(workload_depth)


def channel_capacity(producer, index: int, default_depth: int, overrides: Mapping[str, int]) -> int:
    """Capacity (elements) of the FIFO channel of ``producer``'s output ``index``: its override in
    ``overrides`` (keyed ``<operator name>[<output index>]``, e.g. from ``stepsim size-fifos``), else the
    producer's own ``channel_depth``, else ``default_depth`` (the run's, :func:`resolve_channel_depth`). The
    lowering (:mod:`stepsim.graph.lower`) sizes every channel so."""
    override = overrides.get(f"{producer.name}[{index}]")
    if override:
        return override
    return default_depth if producer.channel_depth is None else int(producer.channel_depth)
