"""Calibrate again every stored calibration of the seeded accuracy tests (tests/calibration_seeding.py): runs
those tests with ``STEPSIM_TEST_COLLECT_CALIBRATIONS`` set (no seeds given: each calibrates from scratch, about
ten minutes on two cores), then makes this folder hold exactly what they made, whether or not the tests' pinned
numbers still hold (the records are what today's code calibrates; the pins are the tests' business). Run from anywhere:
``python tests/calibration_seeds/refresh.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: the test files that run fast mode on seeded caches
SEEDED_TESTS = ("tests/serve/test_fast_accuracy.py", "tests/serve/test_fast_accuracy_models.py",
                "tests/serve/test_fast_accuracy_mixtral.py", "tests/plan/test_plan_layer_list.py", "tests/plan/test_plan.py",
                "tests/serve/test_layer_list_system.py",
                "tests/plan/test_plan_disaggregated.py", "tests/serve/test_serve_system_mapped_ep.py",
                "tests/test_readme.py")


def main() -> int:
    with tempfile.TemporaryDirectory() as collect:
        env = {**os.environ, "STEPSIM_TEST_COLLECT_CALIBRATIONS": collect}
        status = subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile",
                                  *SEEDED_TESTS], cwd=ROOT, env=env)
        for old in HERE.glob("*.json"):
            old.unlink()
        made = sorted(Path(collect).glob("*.json"))
        for record in made:
            shutil.copyfile(record, HERE / record.name)
    print(f"stored {len(made)} calibrations in {HERE}; the seeded tests exited {status}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
