"""Shared pieces of the sweep tests: a small SwiGLU simulation sweep with known results, file helpers."""

from __future__ import annotations

from pathlib import Path

#: cycles of SwiGLU (D=256, F=512, B=64) on step-hdl per (tile_m, tile_n), as ``stepsim run swiglu`` prints them
SWIGLU_CYCLES = {(16, 16): 33288, (16, 32): 29399, (16, 64): 27502, (32, 16): 21222, (32, 32): 17096,
                 (32, 64): 15276}
#: off-chip bytes of the same points (symbolic == measured)
SWIGLU_OFF_CHIP = {(16, 16): 8454144, (16, 32): 7405568, (16, 64): 6881280, (32, 16): 5308416,
                   (32, 32): 4259840, (32, 64): 3735552}

SWIGLU_SIMULATE = """
workload = "swiglu"
mode = "simulate"
out = "results"
[axes]
tile_m = [16, 32]
tile_n = [16, 32, 64]
"""


def files_under(root: Path, pattern: str = "**/*") -> list[str]:
    """Relative POSIX paths of the files under ``root`` matching ``pattern``, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file())
