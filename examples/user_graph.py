"""A user program for ``stepsim run examples/user_graph.py:FUNCTION`` (README, "Your own graphs").

Each function takes no arguments and returns what to simulate: a stepsim Graph, or a Workload (which brings its
own hardware preset, FIFO depth and trace bindings).
"""

import numpy as np

from stepsim.graph import BF16, FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Map, Silu, Tensor
from stepsim.models.presets import MoEModel
from stepsim.workloads.moe.build import build_moe


def silu_rows():
    """SiLU over a 64x256 bf16 tensor in tiles of 16 rows, stored back in fp32."""
    g = Graph("silu-rows")
    x = LinearOffChipLoad(g, Tensor("x", (64, 256), BF16), tile=(16, 256), out_shape_tiled=(4, 1), stride=(1, 0),
                          stream_dtype=FP32)
    LinearOffChipStore(g, Map(g, x, Silu(), compute_bw=1024), tensor_name="y")
    return g


def small_moe_with_shared_expert():
    """A small MoE layer of one's own (8 experts, top-2, one shared expert) on a seeded routing batch."""
    model = MoEModel("my-moe", hidden=64, intermediate=128, experts=8, top_k=2, shared_intermediate=128)
    rng = np.random.default_rng(0)
    routing = np.stack([rng.choice(8, size=2, replace=False) for _ in range(32)])
    return build_moe(model, routing, tiling="dynamic")
