"""Writing ``depths.toml`` (format in :mod:`stepsim.graph.depths_file`, which reads it) for a sizing result."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stepsim._version import __version__


def document(result) -> dict:
    """The file's content for a :class:`~stepsim.passes.sizing.SizingResult`, as plain data for a TOML writer
    (every report value must be a TOML type: a dict becomes a table, None is left out, which TOML cannot say)."""
    ident = result.identity
    workload = {"workload": ident.get("workload", "graph"), "graph": result.graph_name,
                "fingerprint": result.fingerprint,
                "params": json.dumps(ident.get("params", {}), sort_keys=True, default=str)}
    if "config" in ident:
        workload["config"] = json.dumps(ident["config"], sort_keys=True, default=str)
    sizing = {"stepsim_version": __version__, "slack": result.slack}
    sizing.update({key: value for key, value in result.report().items() if value is not None})
    return {"workload": workload, "traces": {"sha256": list(result.trace_hashes)}, "sizing": sizing,
            "channels": {name: int(depth) for name, depth in result.depths.items()}}


def render(result) -> str:
    """The file's text for a :class:`~stepsim.passes.sizing.SizingResult`: written by ``tomli_w`` (assembling
    TOML by hand once wrote a Python dict into the file, which the next ``--fifo-depths`` could not read)."""
    import tomli_w

    return "# FIFO depths (elements) per channel, written by stepsim size-fifos\n\n" + tomli_w.dumps(document(result))


def write_depths_file(result, path: str | os.PathLike) -> Path:
    """Write ``result`` to ``path`` atomically, with the permissions of every other output
    (:func:`stepsim.base.files.atomic_output`: a temp file renamed into place; a full disk is one line)."""
    from stepsim.base.files import atomic_output

    text = render(result)  # before the temp file exists: an unwritable value leaves nothing behind
    with atomic_output(path) as tmp:
        tmp.write_text(text)
    return Path(path)
