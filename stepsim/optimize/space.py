"""The search space of ``stepsim optimize``: which schedules of a workload are candidates.

A space is a list of grids, exactly like a sweep file's ``[[axes]]`` tables (each grid is the cartesian
product of its axes; grids follow one another), on top of the *base* knobs the user fixed (model, trace,
hardware, ...). The default spaces (derived from the model and the trace, so they fit the user's workload):

MoE (``E`` experts, intermediate size ``F``, batch ``B`` tokens)
    * tiling: ``dynamic``, or ``static`` with ``tile_n`` over the powers of two ``1, 2, 4, ... <= B``;
    * ``tile_f``: the divisors of ``F`` in :data:`TILE_F_RANGE` (32 ... 256 columns: below 32 the weight
      tiles are too thin to use a compute node, above 256 one tile holds most of a small expert);
    * time-multiplexing ``regions``: the divisors of ``E``. ``regions = E`` (one dedicated region per expert,
      the paper's baseline) is written by leaving ``regions`` unset, so the builder uses that experiment's
      defaults (``compute_bw`` 4096 static / 6400 dynamic) and the paper's dynamic-tiling point (tile_f 64) is a
      candidate; ``regions < E`` uses the time-multiplexing experiment's ``compute_bw`` 1024;
    * FIFO depths: the workload's default (2 for MoE, the paper's), uniform for every channel.

Attention (``B`` requests)
    * ``strategy``: coarse, interleave, dynamic;
    * ``regions``: the powers of two ``1 ... min(B, 16)`` that divide ``B`` (interleave needs ``B % regions
      == 0``); for coarse only those up to ``ceil(B/16)``, since coarse uses ``min(ceil(B/16), regions)``.

Decoder layer (``B`` requests), searched stage by stage
    1. *attention*: ``strategy`` (coarse, interleave, dynamic; its regions per KV head are the decoder's 4),
       with the FFN at the first point of stage 2's grid (MoE: dynamic tiles, the smallest ``tile_f``, a region
       per expert), which every model can build;
    2. *FFN*: the MoE grids above for the decoder's MoE block (its experts, expert intermediate size and batch;
       ``tile_f`` must also divide a shared expert's width, other values are not buildable), or ``tile_f`` for a
       dense FFN, each with every ``strategy`` on stage 1's Pareto front.

    Why stage by stage: the layer's cycles are close to the sum of its two stages' (the FFN needs most of the
    batch before its first row), and its on-chip bytes and allocated compute are the sums, so an attention choice
    that stage 1 shows dominated (same FFN) stays dominated under any FFN. The product (3 x the FFN grid) is
    never simulated whole: stage 2 multiplies the FFN grid by the kept strategies only. Each stage's search is
    exact on its own space; across stages it relies on that near-additivity (not a proof).

Overriding (``--space FILE``): a TOML file of ``[[axes]]`` tables (or one ``[axes]`` table), in the format of
a sweep file's axes (:mod:`stepsim.batch.config`: lists, ``{start, stop, step|factor}`` ranges, ``{glob}`` for
files); it replaces the default grids. Uniform FIFO depths are an axis like any other
(``channel_depth = [2, 8, 32]``). FIFO depths sized by the FIFO-sizing pass (``stepsim size-fifos``) enter as
the ``fifo_depths`` knob: a depths file is made for one graph, so it is given per grid of one configuration
(``fifo_depths = ["depths.toml"]`` next to that configuration's single-valued axes). *Hook*: a search that
sizes the FIFOs of each candidate itself would add a ``fifo_depths`` value per candidate in
:func:`stepsim.optimize.search.candidate_configs`; the rest of the search (symbolic bounds, pruning, front)
does not depend on the depths, since FIFO buffers do not enter the published on-chip accounting.

Note: in the published accounting FIFO buffers cost no on-chip bytes, so deeper FIFOs can only tie or win on
cycles; the ``paper`` convention (``--convention paper``) counts them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.files import refuse_special_file

#: tile_f candidates of the default MoE space: divisors of F in this closed range (columns)
TILE_F_RANGE = (32, 256)
#: largest attention region count of the default space
MAX_ATTENTION_REGIONS = 16
#: workloads stepsim optimize searches
OPTIMIZE_WORKLOADS = ("moe", "attention", "decoder")
#: the attention strategies of the decoder's first stage
DECODER_STRATEGIES = ("coarse", "interleave", "dynamic")
#: top-level keys of a space file
SPACE_KEYS = ("axes",)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def powers_of_two(limit: int) -> list[int]:
    """``1, 2, 4, ...`` up to and including ``limit``."""
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def tile_f_choices(width: int) -> tuple[int, ...]:
    """The ``tile_f`` values of an FFN of ``width`` columns: its divisors in :data:`TILE_F_RANGE` (the width
    itself when none is)."""
    lo, hi = TILE_F_RANGE
    return tuple(d for d in divisors(width) if lo <= d <= hi) or (width,)


def default_moe_grids(experts: int, intermediate: int, batch: int) -> list[dict]:
    """The default MoE grids (see the module docstring): dynamic and static tiling, each with the dedicated
    regions (``regions`` unset) and with every time-multiplexed region count."""
    tile_f = tile_f_choices(intermediate)
    shared = tuple(r for r in divisors(experts) if r < experts)
    tile_n = tuple(powers_of_two(batch))
    grids = [{"tiling": ("dynamic",), "tile_f": tile_f}]
    if shared:
        grids.append({"tiling": ("dynamic",), "tile_f": tile_f, "regions": shared})
    grids.append({"tiling": ("static",), "tile_n": tile_n, "tile_f": tile_f})
    if shared:
        grids.append({"tiling": ("static",), "tile_n": tile_n, "tile_f": tile_f, "regions": shared})
    return grids


def default_decoder_stages(model, batch: int) -> list[tuple[str, list[dict]]]:
    """The decoder's default space as ``[(stage name, grids)]`` (module docstring): the attention strategies,
    then the FFN grids (without ``strategy``: the search adds the strategies stage 1 keeps). ``model``: a
    :class:`stepsim.models.presets.ModelConfig`."""
    if model.is_moe:
        ffn = default_moe_grids(model.experts, model.expert_intermediate, batch)
    else:
        ffn = [{"tile_f": tile_f_choices(model.dense_intermediate)}]
    reference = {knob: values[:1] for knob, values in ffn[0].items()}  # the FFN grid's first point
    return [("attention", [{"strategy": DECODER_STRATEGIES, **reference}]), ("ffn", ffn)]


def default_attention_grids(batch: int) -> list[dict]:
    """The default attention grid: the three strategies times the region counts (see the module docstring).

    Coarse parallelization uses ``min(ceil(B/16), regions)`` regions (``build_attention``), so region counts
    above ``ceil(B/16)`` build the same graph as ``ceil(B/16)``: only the distinct ones are candidates.
    """
    regions = tuple(r for r in powers_of_two(min(batch, MAX_ATTENTION_REGIONS)) if batch % r == 0)
    coarse = tuple(r for r in regions if r <= -(-batch // 16)) or regions[:1]
    return [{"strategy": ("coarse",), "regions": coarse},
            {"strategy": ("interleave", "dynamic"), "regions": regions}]


def load_space(path: str | Path, workload: str) -> list[dict]:
    """The grids of the space file ``path`` (format: the module docstring), checked like a sweep file's axes.

    Raises
    ------
    ConfigError
        Missing or invalid file, an unknown key (naming it and the file), a bad axis value.
    """
    from stepsim.batch.config import parse_sweep

    path = Path(path)
    refuse_special_file(path, ConfigError, "a space")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--space: space file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"--space: {path} is a folder, not a space file") from None
    except OSError as exc:
        raise ConfigError(f"--space: cannot read space file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # binary bytes: not UTF-8, so not TOML
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key in data:
        if key not in SPACE_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}; a space file holds [axes] or [[axes]] tables only")
    if "axes" not in data:
        raise ConfigError(f"{path}: no [axes] or [[axes]] table; a space file lists the axes to search")
    spec = parse_sweep({"workload": workload, "axes": data["axes"]}, source=path)
    return [dict(g) for g in spec.grids]


def grid_size(grids: list[Mapping]) -> int:
    """Points of ``grids`` (before duplicates are dropped): :func:`stepsim.batch.config.grid_points`."""
    from stepsim.batch.config import grid_points

    return grid_points(grids)
