"""Serving metrics as ``vllm bench serve`` computes them (vllm/benchmarks/serve.py ``calculate_metrics``).

Per request (seconds; a token's time is the end of the step that produced it, a request's send time its
arrival): TTFT = first token - arrival; E2E = last token - arrival; TPOT = (E2E - TTFT) / (output tokens - 1),
only for outputs of more than one token. ITL pools every gap between consecutive tokens of every request (a
preemption stall is one large gap). ``dur`` = last completion - first arrival; request throughput = completed /
dur; token throughput = output tokens / dur. Goodput = requests meeting every given SLO / dur (an output of one
token counts as TPOT 0); SLO attainment = those requests / completed. Statistics are ``mean`` and the 50th, 90th
and 99th percentiles with numpy's default (linear) interpolation, as vLLM reports them.
"""

from __future__ import annotations

import math
import re

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import MAX_TIME_S, MAX_TIME_TEXT

#: SLO keys ``--slo`` takes (``e2el`` is vLLM's name for e2e)
SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "e2el": "e2e"}
_SLO_ITEM = re.compile(r"^(?P<key>[a-z0-9]+)=(?P<value>[-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)(?P<unit>ms|s)$")


def parse_slo(text: str) -> dict[str, float]:
    """``ttft=2s,tpot=200ms`` -> ``{"ttft": 2.0, "tpot": 0.2}`` (seconds). Keys: ttft, tpot, e2e (or e2el).

    Raises
    ------
    ConfigError
        One line naming the part that does not parse.
    """
    slo: dict[str, float] = {}
    for part in text.split(","):
        m = _SLO_ITEM.match(part.strip().lower())
        if not m or m["key"] not in SLO_KEYS:
            raise ConfigError(f"--slo {text!r}: cannot parse {part.strip()!r}; expected KEY=NUMBER(s|ms) with KEY "
                              "ttft, tpot or e2e, e.g. ttft=2s,tpot=200ms")
        key = SLO_KEYS[m["key"]]
        if key in slo:
            raise ConfigError(f"--slo {text!r}: {key} is given twice")
        value = float(m["value"]) / (1000.0 if m["unit"] == "ms" else 1.0)
        if value <= 0:
            raise ConfigError(f"--slo {text!r}: {key} must be positive")
        if not math.isfinite(value):  # 1e999s: JSON has no infinity for the summary's slo
            raise ConfigError(f"--slo {text!r}: {key} {m['value']}{m['unit']} is not a finite time")
        if value > MAX_TIME_S:  # 1e308s: the figure's SLO line and axis overflowed (stepsim.base.ranges)
            raise ConfigError(f"--slo {text!r}: {key} must be at most {MAX_TIME_TEXT}")
        slo[key] = value
    return slo


def distribution(values: np.ndarray) -> dict[str, float | None]:
    """``{mean, p50, p90, p99}`` of ``values`` (None for each when empty)."""
    if len(values) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(np.mean(values)), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def request_latencies(arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray,
                      output: np.ndarray) -> dict[str, np.ndarray]:
    """Per-request ``ttft_s``, ``e2e_s`` and ``tpot_s`` (NaN for outputs of one token)."""
    ttft = first_token - arrival
    e2e = finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output > 1, (e2e - ttft) / np.maximum(output - 1, 1), np.nan)
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}


def summarize(arrival: np.ndarray, finish: np.ndarray, output: np.ndarray, lat: dict[str, np.ndarray],
              itl: np.ndarray, slo: dict[str, float] | None) -> dict:
    """The summary's metric keys (every request completed).

    ``slo_attainment`` and ``goodput_requests_per_s`` are None without an SLO.
    """
    n = len(arrival)
    dur = float(finish.max() - arrival.min())
    tpot = lat["tpot_s"]
    out = {
        "requests": n,
        "completed": n,
        "duration_s": dur,
        "output_tokens": int(output.sum()),
        "throughput_tokens_per_s": float(output.sum()) / dur,
        "throughput_requests_per_s": n / dur,
        "ttft_s": distribution(lat["ttft_s"]),
        "tpot_s": distribution(tpot[~np.isnan(tpot)]),
        "itl_s": distribution(itl),
        "e2e_s": distribution(lat["e2e_s"]),
        "slo": slo or None,
        "slo_attainment": None,
        "goodput_requests_per_s": None,
    }
    if slo:
        good = np.ones(n, dtype=bool)
        for key, limit in slo.items():
            values = np.nan_to_num(lat[f"{key}_s"], nan=0.0)  # one output token: TPOT 0, as vLLM counts it
            good &= values <= limit
        out["slo_attainment"] = int(good.sum()) / n
        out["goodput_requests_per_s"] = int(good.sum()) / dur
    return out
