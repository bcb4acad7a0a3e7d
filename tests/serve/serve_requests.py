"""A helper of the serve tests: small request traces written in the serving request schema (a module of its own,
not conftest: ``from conftest import`` finds whichever test folder's conftest comes first on sys.path)."""

from __future__ import annotations

import numpy as np

from stepsim.trace_io.requests import RequestTrace, write_requests


def requests_file(path, arrival, prompt, output, request_id=None):
    """Write a request trace (``arrival`` s, ``prompt`` / ``output`` tokens; scalars broadcast) to ``path``."""
    arrival = np.asarray(arrival, dtype=np.float64)
    n = len(arrival)
    prompt = np.broadcast_to(np.asarray(prompt, dtype=np.int64), (n,)).copy()
    output = np.broadcast_to(np.asarray(output, dtype=np.int64), (n,)).copy()
    rid = np.arange(n, dtype=np.int64) if request_id is None else np.asarray(request_id, dtype=np.int64)
    return write_requests(RequestTrace(str(path), rid, arrival, prompt, output), path)


def azure_window(source, first: int, count: int, path):
    """Requests ``first .. first + count - 1`` of an Azure request CSV (``source``, read at run time: the shared
    traces are never copied into the repository) written to ``path`` with the header, byte for byte as shipped
    (Windows line endings kept)."""
    lines = source.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], *lines[1 + first: 1 + first + count]]) + b"\n")
    return path
