"""Build small traces folders (laid out like ../shared/traces) from the real files, for the reproduce tests."""

from __future__ import annotations

import shutil
from pathlib import Path

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
