"""FIFO depths of the MoE experiments per batch size, and the sentence that says which one a table used.

The paper ran dynamic tiling at B=64 (both models) and B=1024, and time-multiplexing at B=64, all with FIFOs of
2 elements, except the Qwen B=1024 sweep, which the artifact runs with ``channel_depth=None`` (step-perf's
"unbounded" default of 1024 elements) because Qwen3-30B-A3B deadlocks at depth 2 at that batch size (128
experts, 8 per token: some expert's FIFOs fill while the Reassemble waits for another). For Qwen batch sizes
the paper did not run (any B but 64 in time-multiplexing, any B but 64 and 1024 in dynamic tiling), ``stepsim
reproduce`` uses the artifact's setting for the nearest case it has, the unbounded 1024, so it never fails on
them; the summary says so. Mixtral keeps 2 everywhere, as in the artifact. Depths sized for a workload by
``stepsim size-fifos`` show how much memory those 1024-element FIFOs really need.
"""

from __future__ import annotations

#: step-perf's ``None`` channel depth (elements)
UNBOUNDED = 1024
#: the experiments' default FIFO depth (elements)
DEFAULT = 2
#: (experiment, model, batch) the paper ran -> FIFO depth it used
PAPER = {("dynamic-tiling", "mixtral-8x7b", 64): DEFAULT, ("dynamic-tiling", "qwen3-30b-a3b", 64): DEFAULT,
         ("dynamic-tiling", "mixtral-8x7b", 1024): DEFAULT, ("dynamic-tiling", "qwen3-30b-a3b", 1024): UNBOUNDED,
         ("time-multiplexing", "qwen3-30b-a3b", 64): DEFAULT}


def fifo_depth(experiment: str, model: str, batch: int) -> int:
    """The FIFO depth (elements) ``experiment`` runs ``model`` at batch ``batch`` with (see the module)."""
    if (experiment, model, batch) in PAPER:
        return PAPER[experiment, model, batch]
    return UNBOUNDED if model == "qwen3-30b-a3b" else DEFAULT


def fifo_note(experiment: str, model: str, batch: int) -> str:
    """``"FIFOs 1024 deep (...)"``: the depth used and where it comes from."""
    depth = fifo_depth(experiment, model, batch)
    if (experiment, model, batch) in PAPER:
        why = "the artifact's unbounded None" if depth == UNBOUNDED else "the paper's setting"
    elif depth == UNBOUNDED:
        why = (f"the artifact's unbounded None for Qwen beyond B=64; the paper did not run B={batch}, and depth "
               f"{DEFAULT} can deadlock; stepsim size-fifos gives the depths it needs")
    else:
        why = f"the experiments' default; the paper did not run B={batch}"
    return f"FIFOs {depth} deep ({why})"
