"""How far the expert-parallel block's knobs, chosen on the one-chip proxy (stepsim/mapping/expert_parallel.py), are
from the best knobs of the same space searched on the system's own graph (docs/mapping.md §9, bench/README.md
"The expert-parallel proxy against a search on the system").

For each ``SYSTEM:TOKENS``: every candidate of the proxy's ``ffn`` space (:func:`stepsim.mapping.kinds.ffn.ffn_space`
of :func:`~stepsim.mapping.expert_parallel.chip_block`), its regions times the chips (``tile_f`` halved as
:func:`~stepsim.mapping.expert_parallel.ep_knobs` halves it), built on the system
(:func:`~stepsim.workloads.moe.mapped_ep.build_mapped_ep`), its units assigned chip by chip (a candidate whose
operators do not fit a chip's units is skipped) and simulated on the mapper's representative routings of that
token count (their mean cycles, as the mapper decides); then :func:`~stepsim.mapping.expert_parallel.ep_schedule`'s
choice the same way. Prints one JSON line a case: the chosen knobs and cycles, the best and the ratio.

    python bench/ep_proxy_gap.py examples/small-moe.json ring-2:8 ring-2:40 ring-4:9
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings


def gap(model, system, tokens: int, hardware) -> dict:
    """The proxy's choice against the exhaustive search on ``system`` at ``tokens`` tokens (module docstring)."""
    from stepsim.base.errors import ArgumentError
    from stepsim.mapping.expert_parallel import _mean_cycles, assign_chip_units, chip_block, ep_schedule
    from stepsim.mapping.kinds.ffn import ffn_routing, ffn_space
    from stepsim.mapping.units import Infeasible, compute_ops
    from stepsim.workloads.moe.mapped_ep import build_mapped_ep

    def mean_cycles(knobs: dict) -> float:
        """As the search decides (:func:`~stepsim.mapping.expert_parallel._mean_cycles`): the units assigned on the
        representative routing (Infeasible: they do not fit), then the mean over the representative routings."""
        representative = build_mapped_ep(model, ffn_routing(tokens, model), system=system, **knobs)
        assign_chip_units(representative, hardware)
        plan = {op.name: op.compute_bw for op in compute_ops(representative.graph)}
        return _mean_cycles(tokens, model, system, hardware, knobs, plan, representative)  # sample 0 built here

    start = time.perf_counter()
    dims, size = chip_block(tokens, model, system.chips)
    best, tried, seen = None, 0, set()
    for candidate in ffn_space(size, dims):
        knobs = dict(candidate, regions=candidate["regions"] * system.chips)
        while model.shared_intermediate % knobs["tile_f"]:
            knobs["tile_f"] //= 2
        key = tuple(sorted(knobs.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            cycles = mean_cycles(knobs)
        except (Infeasible, ArgumentError):  # more operators than a chip's units; knobs the layer cannot take
            continue
        tried += 1
        if best is None or cycles < best[0]:
            best = (cycles, knobs)
    chosen, plan = ep_schedule(tokens, model, system, hardware)
    cycles = _mean_cycles(tokens, model, system, hardware, chosen, plan)
    return {"system": system.name, "tokens": tokens, "chosen": chosen, "chosen_cycles": cycles, "best": best[1],
            "best_cycles": best[0], "ratio": round(cycles / best[0], 4), "candidates": tried,
            "wall_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    from stepsim.base.hardware import Hardware
    from stepsim.base.system import System
    from stepsim.models.presets import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an MoE model: a preset name or an HF config.json")
    parser.add_argument("cases", nargs="+", metavar="SYSTEM:TOKENS", help="a system preset and a token count")
    parser.add_argument("--hardware", default="sn40l")
    args = parser.parse_args()
    hardware = Hardware.preset(args.hardware)
    model = resolve_model(args.model).moe
    warnings.simplefilter("ignore")  # tile_n above a chip's tokens: padding, as the mapper's candidates
    for case in args.cases:
        name, tokens = case.split(":")
        system = dataclasses.replace(System.preset(name), hardware=hardware)
        print(json.dumps(gap(model, system, int(tokens), hardware)), flush=True)


if __name__ == "__main__":
    main()
