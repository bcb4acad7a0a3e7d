"""The cache of ``--fidelity fast`` calibrations (docs/serving.md §10.4): one JSON file per calibration, named by a
key that hashes everything that determines it, checksummed, written atomically, and never reused when it cannot
be trusted (unreadable, truncated, edited, or another key's: a one-line warning, then the run calibrates again).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import stepsim.serve.fast as _fast
from stepsim.base.defaults import TIMING_MODEL_VERSION
from stepsim.base.errors import StepsimWarning
from stepsim.base.files import atomic_output, file_sha256, stable_hash


def calibration_key(parts: dict) -> str:
    """The cache key: a stable hash of everything that determines a calibration, the fitted model's source
    (:mod:`stepsim.serve.fast` and :mod:`stepsim.serve.fast_mapped`) included (a calibration made by other code is
    never reused, even when CALIBRATION_VERSION was not bumped), and so are the sources of the exact pricing it
    fits (:data:`PRICING_SOURCES`)."""
    return stable_hash({"calibration_version": _fast.CALIBRATION_VERSION, "model_source": _MODEL_SOURCE,
                        "timing_model_version": TIMING_MODEL_VERSION, **parts})


def schedule_identity(schedule: str) -> dict:
    """The calibration key's part for how the layers are built: ``{"mode": schedule}``; for mapped layers
    (``auto``) also the mapper's version and the SHA-256 of its sources and the mapped builders' (the same hash the
    mapper keys its cache on): the schedules each bucket gets follow from those, the model and the hardware (both in
    the key already), so a calibration on other schedules is never reused."""
    if schedule != "auto":
        return {"mode": schedule}
    from stepsim.mapping import mapper

    return {"mode": schedule, "mapping": {"mapper_version": mapper.MAPPER_VERSION, "source": mapper.source_hash()}}


#: the modules a calibration depends on besides the fitted model's (:mod:`stepsim.serve.fast`,
#: :mod:`stepsim.serve.fast_mapped`, their solver :mod:`stepsim.serve.exact_lstsq`): the exact pricing it fits
#: (the layers, how a step's work is priced, the synthetic routing it draws) and the builders of the layers it
#: simulates, relative to the ``stepsim`` package. A change to any of them can change the fitted numbers without
#: CALIBRATION_VERSION being bumped (the engine's timing is TIMING_MODEL_VERSION, in the key too).
PRICING_SOURCES = (
    "serve/fast.py", "serve/fast_mapped.py", "serve/ffn_points.py", "serve/exact_lstsq.py", "serve/exact.py", "serve/layers.py",
    "serve/latency.py", "serve/routing.py", "serve/projections.py", "serve/layer_list.py", "workloads/moe/build.py",
    # a layer group's kinds, its attention's weights and an MLA group's matrices (serve/layer_list.py)
    "models/layers.py",
    "workloads/moe/stage.py",
    "workloads/attention/build.py", "workloads/prefill_attention/build.py", "mapping/roofline.py",
    "mapping/projection.py",
    # a system's pieces: the sharded block, each chip's mapped experts, their fast regressors
    "serve/system.py", "serve/system_fast.py", "serve/fast_mapped_ep.py", "workloads/sharding.py",
    "workloads/moe/sharded.py", "workloads/moe/mapped_ep.py", "mapping/expert_parallel.py",
)


def _pricing_source() -> str:
    """SHA-256 over :data:`PRICING_SOURCES` (files missing from an install would fail here, loudly)."""
    package = Path(_fast.__file__).parents[1]
    return stable_hash([file_sha256(package / name) for name in PRICING_SOURCES])


#: part of every calibration key (:func:`_pricing_source`, once a process)
_MODEL_SOURCE = _pricing_source()


#: the record's keys (besides its checksum) and the JSON type of each
_RECORD_KEYS = {"key": str, "theta": dict, "error": dict, "forms": dict, "stats": dict}


def _checksum(record: dict) -> str:
    """SHA-256 of a calibration record's content (every key but ``sha256``) as canonical JSON: floats round-trip
    through JSON exactly, so the record read back hashes as the one written."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _record_problem(record, key: str) -> str | None:
    """Why a cached calibration file cannot be used (None: it can)."""
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not a calibration record"
    if record.get("sha256") != _checksum(record):  # truncated, edited or not written by this code
        return "its checksum does not match its content"
    for name, kind in _RECORD_KEYS.items():
        if not isinstance(record.get(name), kind):
            return f"its {name!r} is not a JSON {kind.__name__.replace('str', 'string').replace('dict', 'object')}"
    if record["key"] != key:  # a file copied or renamed from another calibration
        return f"it holds the calibration {record['key'][:16]}..., not {key[:16]}..."
    return None


def load_calibration(cache: Path, key: str) -> dict | None:
    """The calibration cached under ``key`` in ``cache``, or None when there is none. A file that cannot be used
    (unreadable, not JSON, truncated, edited: its checksum does not match, or another key's) is never reused: a
    one-line warning says why and None makes the run calibrate again and replace it."""
    path = cache / f"{key}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problem = f"unreadable ({type(exc).__name__}: {exc})"
    else:
        problem = _record_problem(record, key)
    if problem is not None:
        warnings.warn(f"calibration cache file {path}: {problem}; calibrating again (the file will be replaced)",
                      StepsimWarning, stacklevel=2)
        return None
    record.pop("sha256")
    return record


def save_calibration(cache: Path, key: str, record: dict) -> Path:
    """Write ``record`` (with its checksum) to ``cache``/``key``.json, atomically."""
    path = cache / f"{key}.json"
    with atomic_output(path) as tmp:  # creates the folder; a failure is one OutputError line naming the file
        # keys in the order the run made them: a cached run's summary.json is the calibrating run's, byte for byte
        tmp.write_text(json.dumps({**record, "sha256": _checksum(record)}, indent=2) + "\n", encoding="utf-8")
    return path
