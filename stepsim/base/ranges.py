"""Range checks for values of the right type that mean nothing: one checker per kind of value, shared by the
command line's flags, the files stepsim reads and the Python API, so each refuses the same values with the same
words.

Simulated time is float64 seconds. A float64 near ``t`` seconds resolves ``t * 2**-52`` s, so a time beyond
:data:`MAX_TIME_S` (2**32 s, about 136 years, where the resolution is 2**-20 s, just under a microsecond) would
let a step of a few microseconds vanish in rounding: arrivals written in epoch milli-, micro- or nanoseconds,
or a value such as 1e300, would replay with every latency 0. Such times are refused, never rebased (an
``arrival_s`` column is used as given; epoch seconds, about 1.7e9, resolve 0.24 microseconds and are fine).
The bound also keeps every time an int64 count of nanoseconds (2**32 s is 4.3e18 ns, below 2**63), as the serve
timeline writes them.
"""

from __future__ import annotations

import math
import numbers

from stepsim.base.errors import ConfigError

#: the largest simulated time (s) stepsim takes: 2**32 s (about 136 years); float64 resolves 2**-20 s there
MAX_TIME_S = float(2**32)
#: how :data:`MAX_TIME_S` is spelled in messages
MAX_TIME_TEXT = "2**32 s (about 136 years; beyond it float64 seconds are coarser than a microsecond)"


def is_real(value) -> bool:
    """A real number (int or float, numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_seconds(name: str, value, *, maximum: float = MAX_TIME_S) -> float:
    """``value`` as float seconds when it is a finite number in ``(0, maximum]``; else a ConfigError naming
    ``name`` (a flag, a config key or a keyword) and the value. NaN, infinities, 0, negatives, bools, strings and
    times beyond :data:`MAX_TIME_S` are refused."""
    if not is_real(value) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    if value > maximum:
        raise ConfigError(f"{name} must be at most {_max_text(maximum)}, got {value!r}")
    return float(value)


def _max_text(maximum: float) -> str:
    return MAX_TIME_TEXT if maximum == MAX_TIME_S else f"{maximum:g} s"


def first_beyond_time_range(times) -> int | None:
    """The index of the first of ``times`` (a sorted or unsorted float array, s) beyond :data:`MAX_TIME_S`, else
    None (NaN and infinities are the callers' own checks)."""
    import numpy as np

    over = np.asarray(times, dtype=np.float64) > MAX_TIME_S
    return int(np.argmax(over)) if over.any() else None



def non_finite(obj, path: str = "") -> tuple[str, float] | None:
    """``(key path, value)`` of the first NaN or infinity in a JSON-like ``obj`` (dicts, lists, tuples, numbers;
    paths such as ``ttft_s.mean`` or ``runs[2].cycles``), else None: JSON has no such numbers, and Python's
    ``json`` writes them as ``NaN`` / ``Infinity``, which other readers refuse."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (path or "the value", obj)
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = non_finite(value, (f"{path}.{key}" if path else str(key)) if isinstance(obj, dict)
                           else f"{path}[{key}]")
        if found is not None:
            return found
    return None


def finite_json_value(obj):
    """``obj`` (JSON-like: dicts, lists, tuples, numbers, strings; numpy scalars and arrays too) with every NaN or
    infinity replaced by None, so it is written as JSON ``null``: Python's ``json`` would write ``NaN`` /
    ``Infinity``, which is not JSON (``jq``, browsers and most readers refuse the whole document). A value that
    is not a number, such as a metric a run does not have, is ``null`` in every ``--json`` output."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json_value(v) for v in obj]
    tolist = getattr(obj, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return finite_json_value(tolist())
    return obj


def json_text(obj, **kwargs) -> str:
    """``json.dumps(obj, **kwargs)`` of :func:`finite_json_value` (``allow_nan=False``): valid JSON always, the one
    way every ``--json`` output and JSON file of the command line is written."""
    import json

    return json.dumps(finite_json_value(obj), allow_nan=False, **kwargs)
