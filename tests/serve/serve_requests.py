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
