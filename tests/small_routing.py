"""The small routing trace the multi-chip MoE tests share: 24 tokens, each routed to 2 different experts of 8
(seeded), written as a routing ``.npz`` (array ``data``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def small_routing(seed: int = 3) -> np.ndarray:
    """``[24, 2]`` expert ids of 8 experts drawn with ``seed``, the two experts of a token different."""
    routing = np.random.default_rng(seed).integers(0, 8, size=(24, 2))
    routing[:, 1] = (routing[:, 0] + 1 + routing[:, 1] % 7) % 8  # two different experts per token
    return routing


def write_small_routing(folder: Path, name: str = "routing.npz") -> tuple[str, np.ndarray]:
    """Write :func:`small_routing` to ``folder / name``; returns its path (str) and the routing."""
    routing = small_routing()
    path = Path(folder) / name
    np.savez(path, data=routing)
    return str(path), routing


def write_layered_routing(folder: Path, layers: int = 4) -> tuple[str, list[np.ndarray]]:
    """A routing trace of ``layers`` layers for the stack tests: a folder ``folder / "routing"`` of
    ``000_<layer>.npz`` files, layer i :func:`small_routing` drawn with seed i; returns the folder (str) and the
    routings."""
    path = Path(folder) / "routing"
    path.mkdir()
    routings = [small_routing(i) for i in range(layers)]
    for i, routing in enumerate(routings):
        np.savez(path / f"000_{i:03d}.npz", data=routing)
    return str(path), routings


def small_stack_config(path: str, tiling: str = "static", **knobs) -> dict:
    """The stack tests' run config: a custom MoE layer (hidden 16, intermediate 64, 8 experts, top 2) on the routing
    at ``path``, tiles of 4 tokens (static) and 16 columns, plus ``knobs``."""
    return {"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 64, "experts": 8, "top_k": 2,
            "trace": path, "tiling": tiling, "tile_n": 4 if tiling == "static" else None, "tile_f": 16, **knobs}
