"""``stepsim report RUN_DIR`` on a folder written by ``stepsim serve --out``: the run's utilisation and, for a
mapped run (``--schedule auto``), every layer kind and shape bucket its steps used with the mapped schedule's
cycles, HBM and compute utilisation and units (summary.json ``utilisation`` and ``layers``,
:mod:`stepsim.serve.layer_use`).

JSON keys: ``run`` (``"serve"``), ``model``, ``hardware``, ``utilisation`` (summary.json's, or null for a run not
priced by the engine) and ``layers`` (a list, empty for a run on the paper's schedules). A heterogeneous model's
rows each carry their layer group (``group``: its layers and kind), and the text lists them under a line naming each
group."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stepsim.base.errors import ConfigError


def is_serve_folder(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` is a folder of ``stepsim serve --out`` (its summary.json and iterations.parquet)."""
    folder = Path(run_dir)
    return folder.is_dir() and (folder / "summary.json").is_file() and (folder / "iterations.parquet").is_file()


def serve_report(run_dir: str | os.PathLike) -> dict:
    """The report of a serve folder (module docstring); ConfigError for an unreadable summary.json."""
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(summary, dict):
            raise ValueError(f"a JSON {type(summary).__name__}, not an object")
        hardware = summary["hardware"]["name"]
        model = summary["model"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a summary written by stepsim serve ({type(exc).__name__}: {exc})") from None
    return {"run": "serve", "model": model, "hardware": hardware, "utilisation": summary.get("utilisation"),
            "layers": summary.get("layers", [])}


def format_serve_report(rep: dict) -> str:
    """The report as text: the run's utilisation, then a line a layer kind and bucket."""
    use = rep["utilisation"]
    lines = [f"serve run: {rep['model']} on {rep['hardware']}"]
    if use is None:
        lines.append("  no utilisation: its steps were not priced by the engine (--iteration-latency)")
    else:
        lines.append(f"  HBM utilisation {100 * use['hbm']:.1f} % (median step {100 * use['hbm_p50']:.1f} %), "
                     f"compute {100 * use['compute']:.1f} % (median step {100 * use['compute_p50']:.1f} %)")
    if not rep["layers"]:
        lines.append("  layers: on the paper's schedules (--schedule paper): no mapped schedule to report")
        return "\n".join(lines)
    lines.append(f"  {'layer':<8} {'bucket':>6} {'steps':>6} {'cycles':>11} {'HBM':>7} {'compute':>8} "
                 f"{'units (compute/memory)':>22}  knobs")
    group = None
    for r in rep["layers"]:
        if r.get("group") != group:  # a heterogeneous model: each layer group's rows after a line naming it
            group = r["group"]
            lines.append(f"  layers {_layer_span(group['layers'])} ({group['kind']}):")
        knobs = " ".join(f"{k}={v}" for k, v in r["knobs"].items())
        if "chips" in r:  # the MoE block over an expert-parallel system: the units are its busiest chip's
            knobs += f"  ({r['chips']} chips of {r['system']}, units: the busiest chip's)"
        lines.append(f"  {r['kind']:<8} {r['bucket']:>6} {r['steps']:>6} {r['cycles']:>11,} "
                     f"{100 * r['hbm_utilisation']:>6.1f}% {100 * r['compute_utilisation']:>7.1f}% "
                     f"{r['compute_units']:>11}/{r['memory_units']:<10}  {knobs}")
    return "\n".join(lines)


def _layer_span(layers: list[int]) -> str:
    """``0-2`` for consecutive layers, else ``0, 2, 4``."""
    if layers == list(range(layers[0], layers[0] + len(layers))):
        return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
    return ", ".join(map(str, layers))
