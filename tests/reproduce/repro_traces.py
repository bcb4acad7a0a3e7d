"""Build small traces folders (laid out like ../shared/traces) for the reproduce tests: copies of the real
files (:func:`tiny_traces`) or synthetic ones (:func:`write_kv_window`, :func:`write_routing`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

#: one routing batch per model (the paper's)
ROUTING = ("mixtral_b64/008_010.npz", "qwen_b64/032_012.npz")
#: one B=16 window per variance class (the first of each class in the paper's list)
KV_B16 = {"high": "b16/conv_stdev1456_2805_2820.npy", "med": "b16/conv_stdev0987_3349_3364.npy",
          "low": "b16/conv_stdev0480_3799_3814.npy"}


def tiny_traces(shared: Path, dest: Path, routing=ROUTING, kv=tuple(KV_B16.values())) -> Path:
    """Copy ``expert_routing/<routing>`` and ``kv_lengths/<kv>`` files of ``shared`` into ``dest``."""
    for rel in routing:
        target = dest / "expert_routing" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared / "expert_routing" / rel, target)
    for rel in kv:
        target = dest / "kv_lengths" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared / "kv_lengths" / rel, target)
    return dest


def write_kv_window(root: Path, start: int, end: int, kv, *, label: int | None = None, trace: str = "conv") -> Path:
    """Write ``kv`` (int64 KV lengths) as ``kv_lengths/b<B>/<trace>_stdev<label>_<start>_<end>.npy`` under
    ``root``, B = end - start + 1 (the folder is named after the name's range even if ``kv`` disagrees);
    ``label`` defaults to the floor of the sample stdev."""
    kv = np.asarray(kv, dtype=np.int64)
    if label is None:
        label = int(np.floor(np.std(kv.astype(np.float64), ddof=1)))
    folder = root / "kv_lengths" / f"b{end - start + 1}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{trace}_stdev{label:04d}_{start:04d}_{end:04d}.npy"
    np.save(path, kv)
    return path


def write_routing(root: Path, folder: str, routing, name: str = "000_001.npz") -> Path:
    """Write ``routing`` ([B, top_k] expert ids) as ``expert_routing/<folder>/<name>`` under ``root``."""
    path = root / "expert_routing" / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, data=np.asarray(routing, dtype=np.int64))
    return path


def synthetic_routing(rng: np.random.Generator, batch: int, experts: int, top_k: int) -> np.ndarray:
    """[batch, top_k] distinct expert ids per token, uniformly random."""
    return np.argsort(rng.random((batch, experts)), axis=1)[:, :top_k].astype(np.int64)
