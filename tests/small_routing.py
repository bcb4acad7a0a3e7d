"""The small routing trace the multi-chip MoE tests share: 24 tokens, each routed to 2 different experts of 8
(seeded), written as a routing ``.npz`` (array ``data``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def small_routing() -> np.ndarray:
    """``[24, 2]`` expert ids, seed 3, the two experts of a token different."""
    routing = np.random.default_rng(3).integers(0, 8, size=(24, 2))
    routing[:, 1] = (routing[:, 0] + 1 + routing[:, 1] % 7) % 8  # two different experts per token
    return routing


def write_small_routing(folder: Path, name: str = "routing.npz") -> tuple[str, np.ndarray]:
    """Write :func:`small_routing` to ``folder / name``; returns its path (str) and the routing."""
    routing = small_routing()
    path = Path(folder) / name
    np.savez(path, data=routing)
    return str(path), routing
