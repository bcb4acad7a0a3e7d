"""Stored fast-fidelity calibrations for the accuracy tests (tests/calibration_seeds/), as tests/mapping_seeds
stores schedules: a calibration of a 4-layer model simulates hundreds of exact steps (up to three minutes a model
on a loaded core), and the tests that compare fast with a stored exact run need the calibration, not its making
(tests/serve/test_fast*.py calibrate from scratch on small shapes).

A seed is an ordinary cache record: fast mode uses it only when its key, which hashes everything that determines a
calibration (model, hardware, schedules, the sources of the fitted model and of the exact pricing it fits,
stepsim.serve.calibration_cache), equals today's. A test that calibrates although it was given the seeds fails
with the command that refreshes them, so a stale seed is never silently replaced by a slow run (nor trusted).

Refresh: ``python tests/calibration_seeds/refresh.py`` (runs the seeded tests with
``STEPSIM_TEST_COLLECT_CALIBRATIONS`` set: no seeds given, every calibration made and collected).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SEEDS = Path(__file__).parent / "calibration_seeds"
#: set to a folder: the seeded tests calibrate from scratch and copy what they made there (refresh.py)
COLLECT_ENV = "STEPSIM_TEST_COLLECT_CALIBRATIONS"
REFRESH = "python tests/calibration_seeds/refresh.py"


def seeded_cache(folder: Path) -> Path:
    """``folder`` (made) holding a copy of every seed, or nothing when collecting; the calibration cache to give
    ``stepsim.serve(..., calibration_cache=folder)``."""
    folder.mkdir(parents=True, exist_ok=True)
    if not os.environ.get(COLLECT_ENV):
        for seed in SEEDS.glob("*.json"):
            shutil.copyfile(seed, folder / seed.name)
    return folder


def check_seed_used(folder: Path) -> None:
    """After a fast run on ``seeded_cache(folder)``: fail if it calibrated (no seed had today's key); when
    collecting, copy what it calibrated to the collection folder instead."""
    made = sorted(p for p in folder.glob("*.json") if not (SEEDS / p.name).exists())
    collect = os.environ.get(COLLECT_ENV)
    if collect:
        Path(collect).mkdir(parents=True, exist_ok=True)
        for record in folder.glob("*.json"):
            shutil.copyfile(record, Path(collect) / record.name)
    elif made:
        pytest.fail(f"calibrated {', '.join(p.name for p in made)}: no stored calibration has today's key (the "
                    f"fitted model, the exact pricing or a model changed); refresh them: {REFRESH}", pytrace=False)
