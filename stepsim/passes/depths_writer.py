"""Writing ``depths.toml`` (format in :mod:`stepsim.graph.depths_file`, which reads it) for a sizing result."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from stepsim._version import __version__


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render(result) -> str:
    """The file's text for a :class:`~stepsim.passes.sizing.SizingResult`."""
    ident = result.identity
    lines = ["# FIFO depths (elements) per channel, written by stepsim size-fifos", "", "[workload]",
             f"workload = {_toml_str(ident.get('workload', 'graph'))}", f"graph = {_toml_str(result.graph_name)}",
             f"fingerprint = {_toml_str(result.fingerprint)}",
             f"params = {_toml_str(json.dumps(ident.get('params', {}), sort_keys=True, default=str))}"]
    if "config" in ident:
        lines.append(f"config = {_toml_str(json.dumps(ident['config'], sort_keys=True, default=str))}")
    lines += ["", "[traces]", f"sha256 = [{', '.join(_toml_str(h) for h in result.trace_hashes)}]", "",
              "[sizing]", f"stepsim_version = {_toml_str(__version__)}", f"slack = {result.slack!r}"]
    lines += [f"{key} = {value}" for key, value in result.report().items()]
    lines += ["", "[channels]"]
    lines += [f"{_toml_str(name)} = {depth}" for name, depth in result.depths.items()]
    return "\n".join(lines) + "\n"


def write_depths_file(result, path: str | os.PathLike) -> Path:
    """Write ``result`` to ``path`` atomically (a temporary file in the same folder, then ``os.replace``)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(render(result))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
