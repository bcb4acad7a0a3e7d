"""``depths.toml``: the per-channel FIFO depths ``stepsim size-fifos`` writes and ``--fifo-depths`` reads.

Reading and checking live here, below the workloads that apply a file (``--fifo-depths``); writing lives with
the pass that sizes the depths (:mod:`stepsim.passes.depths_writer`), and deciding which run configurations a
file was sized for with the configurations (:func:`stepsim.workloads.config.matches_depths_file`).

A plain TOML file::

    [workload]
    workload = "moe"                       # the workload kind ("graph" for a bare Graph)
    graph = "moe-qwen3-30b-a3b-static"     # Graph.name
    fingerprint = "3f2a..."                # stepsim.graph.channels.graph_fingerprint (channel structure)
    params = '{"batch": 1024, ...}'        # the builder's parameters (canonical JSON)
    config = '{"model": ...}'              # the run config it was sized from (canonical JSON; may be absent)

    [traces]
    sha256 = ["9c1e..."]                   # content hash of every trace it was sized on

    [sizing]                               # the report (informational)
    slack = 0.01
    cycles = 3117734
    ...

    [channels]                             # every channel of the graph, in lowering order
    "LinearOffChipLoad_0[0]" = 2
    "Map_12[0]" = 4

Loading checks the file against the graph it is applied to: the fingerprint must match (else the file was
made for another graph: another model, tiling, tile size, batch size or region count), every depth must be an
int >= 1, and the channel names must be the graph's. Every problem is one :class:`~stepsim.base.errors.ConfigError`
line naming the file.
"""

from __future__ import annotations

import json
import os
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

from stepsim.base.errors import ConfigError, StepsimWarning
from stepsim.graph.channels import channel_names, graph_fingerprint

#: the deepest FIFO a file may give: the limit of --channel-depth (stepsim.workloads.config.INT_MAXIMUM)
MAX_DEPTH = 2**31 - 1


@dataclass(frozen=True)
class DepthsFile:
    """A read ``depths.toml``."""

    path: str
    channels: dict
    fingerprint: str
    graph: str
    workload: str
    params: dict
    config: dict | None
    trace_hashes: list


def read_depths_file(path: str | os.PathLike) -> DepthsFile:
    """Read and check ``path`` (structure and values; not yet against a graph)."""
    p = Path(path)
    from stepsim.base.files import refuse_special_file

    refuse_special_file(p, ConfigError, "a FIFO depths")
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read FIFO depths file: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # a binary file is not UTF-8 text
        raise ConfigError(f"{p}: not a valid TOML file: {exc}") from None
    workload, channels = data.get("workload"), data.get("channels")
    if not isinstance(workload, dict) or not isinstance(channels, dict) or "fingerprint" not in workload:
        raise ConfigError(f"{p}: not a FIFO depths file (needs [workload] with a fingerprint and [channels]; "
                          f"write one with stepsim size-fifos)")
    for name, depth in channels.items():
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"{p}: [channels] {name!r} must be an int >= 1 (elements), got {depth!r}")
        if depth > MAX_DEPTH:  # the engine stores a channel's slots up front: 10**12 would be a MemoryError
            raise ConfigError(f"{p}: [channels] {name!r} = {depth:,} is deeper than stepsim allows ({MAX_DEPTH:,}, "
                              f"the limit of --channel-depth); size the FIFOs with stepsim size-fifos")
    try:
        params = json.loads(workload.get("params", "{}"))
        config = json.loads(workload["config"]) if "config" in workload else None
    except (TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p}: [workload] params/config must be JSON strings: {exc}") from None
    hashes = data.get("traces", {}).get("sha256", [])
    return DepthsFile(path=str(p), channels=dict(channels), fingerprint=str(workload["fingerprint"]),
                      graph=str(workload.get("graph", "?")), workload=str(workload.get("workload", "?")),
                      params=params, config=config, trace_hashes=list(hashes))


def _names(names: list, limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit:,} more" if len(names) > limit else "")


def check_against(depths: DepthsFile, graph) -> dict:
    """The file's channel depths after checking they were made for ``graph`` and name each of its channels
    once (ConfigError otherwise: a file missing channels would run them at the default depth, silently giving
    other cycles than the sizing promised)."""
    fp = graph_fingerprint(graph)
    if fp != depths.fingerprint:
        raise ConfigError(f"{depths.path}: FIFO depths made for another graph ({depths.graph}, fingerprint "
                          f"{depths.fingerprint[:12]}) than this run's ({graph.name}, fingerprint {fp[:12]}); "
                          f"size this workload with stepsim size-fifos")
    names = channel_names(graph)
    missing = [n for n in names if n not in depths.channels]
    if missing:
        raise ConfigError(f"{depths.path}: gives depths for {len(names) - len(missing):,} of the graph's "
                          f"{len(names):,} channels; missing {_names(missing)} (a cut or edited file?); write it "
                          f"again with stepsim size-fifos")
    known = set(names)
    unknown = [n for n in depths.channels if n not in known]
    if unknown:
        raise ConfigError(f"{depths.path}: names {len(unknown):,} channel(s) graph {graph.name} does not have: "
                          f"{_names(unknown)}; write it again with stepsim size-fifos")
    return dict(depths.channels)


def check_trace(depths: DepthsFile, trace_hashes: list[str], trace: str) -> None:
    """Warn (every time) when ``depths`` was sized on traces other than the run's: the graph is the same, so the
    depths apply, but they were chosen for other routing or KV lengths and may run slower or deadlock on these.
    ``trace_hashes``: the run's trace as :func:`stepsim.base.files.trace_sha256` of its file and as the sizing's
    hash of its array (a Workload sized in Python records the latter)."""
    if not depths.trace_hashes or any(h in depths.trace_hashes for h in trace_hashes):
        return
    warnings.warn(f"{depths.path}: sized on another trace (sha256 {depths.trace_hashes[0][:12]}"
                  f"{f' and {len(depths.trace_hashes) - 1} more' if len(depths.trace_hashes) > 1 else ''}) than "
                  f"this run's {trace} (sha256 {trace_hashes[0][:12]}); its depths may run slower or deadlock "
                  f"here; size this trace with stepsim size-fifos", StepsimWarning, stacklevel=2)


def apply_depths_file(workload, path: str | os.PathLike, trace: str | os.PathLike | None = None):
    """Load ``path`` into ``workload.channel_depths`` (checked against its graph, and with ``trace``, the file
    the workload's trace was read from, against the traces it was sized on); returns the workload."""
    depths = read_depths_file(path)
    workload.channel_depths = check_against(depths, workload.graph)
    if trace is not None:
        from stepsim.base.files import arrays_sha256, trace_sha256

        hashes = [trace_sha256(trace)] + ([arrays_sha256(workload.trace)] if workload.trace else [])
        check_trace(depths, hashes, str(trace))
    return workload
