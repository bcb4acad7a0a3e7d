"""A mapped schedule: the knobs a layer is built with, and what they cost and use.

Knobs by kind (:mod:`stepsim.mapping.kinds`):

* ``ffn`` (the MoE block, or a dense FFN as one expert): ``tile_n`` tokens per tile, ``tile_f`` F columns per weight
  tile, ``lanes`` column stripes per expert (:func:`stepsim.workloads.moe.build._expert_ffn`), ``regions`` (one per
  expert, or time-multiplexed regions of several experts);
* ``decode`` (GQA decode attention of one KV head): ``regions`` parallel copies of the per-request subgraph;
* ``prefill`` (causal prefill attention of every KV head): ``regions`` parallel pipelines over the query tiles.

Every compute operator's ``compute_bw`` is not a knob: it follows from the compute units the operator gets
(:func:`stepsim.mapping.units.assign_compute_units`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.files import refuse_special_file

#: the knobs of each mapped kind, in the order they are printed
KNOBS = {"ffn": ("tile_n", "tile_f", "lanes", "regions"), "decode": ("regions",), "prefill": ("regions",)}
#: every kind a schedule may be of: :data:`KNOBS` (what ``stepsim map`` and schedule files take), the serving step's
#: ``projection`` (:mod:`stepsim.mapping.projection`: mapped and cached for the serve providers, not a run's layer)
#: and an MoE model's expert-parallel block on a system (``ep``: :mod:`stepsim.mapping.expert_parallel`, ``regions`` in
#: all)
ALL_KNOBS = {**KNOBS, "projection": ("tile_m", "tile_f", "lanes", "k_parts"),
             "ep": ("tile_n", "tile_f", "lanes", "regions")}


@dataclass(frozen=True)
class Schedule:
    """One layer's mapped schedule.

    Attributes
    ----------
    kind : str
        ``"ffn"``, ``"decode"`` or ``"prefill"``.
    knobs : dict
        ``{knob: int}`` (:data:`KNOBS`).
    cycles : int
        Engine cycles of the layer on the mapper's representative data (:mod:`stepsim.mapping.kinds`).
    bound_cycles : int
        Its lower bound: ``max(off-chip bytes / HBM peak, FLOPs / peak FLOPs)`` (cycles).
    off_chip_bytes, flops : int
        Traffic (bytes) and FLOPs of the representative layer.
    compute_units, memory_units, on_chip_bytes : int
        Units and on-chip bytes (published accounting) the schedule uses.
    candidates : dict
        How the search went: ``{"feasible": n, "simulated": n, "pruned": n, "infeasible": n}``.
    """

    kind: str
    knobs: dict
    cycles: int = 0
    bound_cycles: int = 0
    off_chip_bytes: int = 0
    flops: int = 0
    compute_units: int = 0
    memory_units: int = 0
    on_chip_bytes: int = 0
    candidates: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in ALL_KNOBS:
            raise ConfigError(f"schedule kind must be one of {', '.join(KNOBS)}, got {self.kind!r}")
        want = set(ALL_KNOBS[self.kind])
        if not isinstance(self.knobs, dict) or set(self.knobs) != want:
            raise ConfigError(f"a {self.kind!r} schedule takes the knobs {', '.join(ALL_KNOBS[self.kind])}; "
                              f"got {sorted(self.knobs) if isinstance(self.knobs, dict) else self.knobs!r}")
        for name, value in self.knobs.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"schedule knob {name!r} must be a positive int, got {value!r}")

    def hbm_utilisation(self, peak_bytes_per_cycle: int) -> float:
        """Achieved HBM bytes per cycle over the peak (0..1)."""
        return self.off_chip_bytes / self.cycles / peak_bytes_per_cycle if self.cycles else 0.0

    def compute_utilisation(self, peak_flops_per_cycle: int) -> float:
        """Achieved FLOPs per cycle over the peak (0..1)."""
        return self.flops / self.cycles / peak_flops_per_cycle if self.cycles else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "schedule") -> Schedule:
        """A schedule from its :meth:`to_dict` form (only ``kind`` and ``knobs`` are required)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a schedule is a JSON object with 'kind' and 'knobs', got "
                              f"{type(data).__name__}")
        unknown = set(data) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ConfigError(f"{source}: unknown schedule key(s) {', '.join(sorted(unknown))}")
        if "kind" not in data or "knobs" not in data:
            raise ConfigError(f"{source}: a schedule needs 'kind' and 'knobs'")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except TypeError as exc:
            raise ConfigError(f"{source}: {exc}") from None


def read_schedules(path: str | Path) -> dict[str, Schedule]:
    """``{kind: Schedule}`` from a JSON file holding one schedule object or a list of them (one per kind)."""
    path = Path(path)
    refuse_special_file(path, ConfigError, "a schedule")  # a pipe or /dev/zero would block or fill the memory
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:  # a TOML or hand-written file: say what the format is
        raise ConfigError(f"cannot read schedule file {path}: not JSON ({exc}); a schedule file is the JSON "
                          f"`stepsim map --out` writes") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read schedule file {path}: {exc}") from None
    items = data if isinstance(data, list) else [data]
    schedules: dict[str, Schedule] = {}
    for i, item in enumerate(items):
        schedule = Schedule.from_dict(item, source=f"{path}: schedule {i}")
        if schedule.kind not in KNOBS:  # a serving step's projection is no run's layer
            raise ConfigError(f"{path}: schedule {i}: schedule kind must be one of {', '.join(KNOBS)}, got "
                              f"{schedule.kind!r}")
        if schedule.kind in schedules:
            raise ConfigError(f"{path}: schedule {i}: a second {schedule.kind!r} schedule")
        schedules[schedule.kind] = schedule
    return schedules
