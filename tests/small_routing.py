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


def write_decoder_stack_inputs(folder: Path) -> tuple[Path, Path]:
    """The decoder stack CLI tests' inputs in ``folder``: ``routing.npz``, a Qwen3-shaped ``[32 tokens, 2 layers,
    8 of 128 experts]`` dump (seed 5), and ``kv.npy``, 32 KV lengths; returns both paths."""
    routing, kv = Path(folder) / "routing.npz", Path(folder) / "kv.npy"
    rng = np.random.default_rng(5)
    layers = [np.stack([rng.choice(128, 8, replace=False) for _ in range(32)]) for _ in range(2)]
    np.savez(routing, data=np.stack(layers, axis=1))  # [tokens, layers, top_k]
    np.save(kv, np.array([100, 40, 7, 64, 3, 33, 90, 31] * 4))
    return routing, kv


def sixteen_chip_moe_config(folder: Path) -> dict:
    """A small MoE layer over the 16 chips of ``sn40l-16`` (``--ep 16``, 2 of 32 experts a chip, a region each) on 24
    tokens' routing (seed 0) written to ``folder / "routing.npz"``: its all-to-all Links carry up to 144 transfers,
    each its own symbol."""
    rng = np.random.default_rng(0)
    path = Path(folder) / "routing.npz"
    np.savez(path, data=np.stack([rng.choice(32, size=2, replace=False) for _ in range(24)]))
    return {"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 96, "experts": 32, "top_k": 2,
            "trace": str(path), "tile_n": 4, "regions": 32, "ep": 16, "placement": "load-balanced",
            "system": "sn40l-16"}
