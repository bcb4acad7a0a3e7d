"""Regenerate the small synthetic traces shipped in ``stepsim/data`` (deterministic: same bytes every run).

Run ``python -m stepsim.trace_io.make_bundled [OUT_DIR]`` (default: the package's ``data`` folder). The
traces use fixed seeds and the bundled Azure percentile table (never the real traces), so the files do not
depend on what is installed beside the repository.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stepsim.trace_io.synthetic import synthetic_kv_batches, synthetic_routing
from stepsim.trace_io.writers import write_trace

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

#: file name -> (generator, keyword arguments); seeds are fixed forever (changing one changes the demo)
BUNDLED = {
    "synthetic_routing_mixtral_b64.arrow": (
        synthetic_routing,
        {
            "num_tokens": 64,
            "num_experts": 8,
            "top_k": 2,
            "seed": 8010,
            "model": "mixtral",
            "skew": "dirichlet",
            "alpha": 4.0,
        },
    ),
    "synthetic_routing_qwen_b64.arrow": (
        synthetic_routing,
        {
            "num_tokens": 64,
            "num_experts": 128,
            "top_k": 8,
            "seed": 32012,
            "model": "qwen",
            "skew": "dirichlet",
            "alpha": 0.5,
        },
    ),
    "synthetic_kv_b16.arrow": (synthetic_kv_batches, {"batch": 16, "seed": 3349}),
}


def make_bundled(out_dir: str | Path = DATA_DIR) -> list[Path]:
    """Write every bundled trace into ``out_dir``; returns the written paths."""
    out = Path(out_dir)
    written = []
    for name, (generate, kwargs) in BUNDLED.items():
        write_trace(generate(**kwargs), out / name)
        written.append(out / name)
    return written


def bundled_path(name: str) -> Path:
    """Path of a bundled trace in the installed package."""
    return DATA_DIR / name


if __name__ == "__main__":
    for path in make_bundled(sys.argv[1] if len(sys.argv) > 1 else DATA_DIR):
        print(path)
