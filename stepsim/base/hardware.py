"""Hardware parameters of the simulated accelerator (HBM model, on-chip bandwidth, FIFO depth, and for serving
the clock, HBM and on-chip capacities and peak compute).

A TOML file or overrides start from a preset (``preset = "..."``, default ``step-eval``); every field they
set is recorded in :attr:`Hardware.explicit`, and the name becomes ``<preset>+<field>=<value>,...`` (unless
a ``name`` is given), so a record never labels modified hardware with a preset's name. Which FIFO depth a
run uses (the hardware's ``channel_depth`` against a knob or a workload's own depth) is decided in
:mod:`stepsim.base.defaults`.

Two named presets reproduce the step-perf configurations of docs/timing_model.md §2 / §3.2:

* ``step-eval``: ``HBMConfig(64, 32, 2, 2, 1, 14)``, 1024 B/cycle HBM peak, PMU 64 B/cycle, channel depth 2
  (the paper's evaluation setup).
* ``step-hdl``: ``HBMConfig(64, 8, 2, 2, 1, 14)``, 256 B/cycle HBM peak, PMU 256 B/cycle, channel depth 1
  (the HDL validation, README Fig. 8).

A third, ``sn40l``, is one socket of SambaNova's SN40L from its public specifications (docs/hardware.md).

The serving fields (``clock_hz``, ``hbm_capacity_bytes``, ``on_chip_capacity_bytes``, ``peak_flops_per_cycle``)
change no cycle count: they turn cycles into seconds, size the KV cache, refuse a layer that does not fit on chip
and bound compute. The resource fields (``compute_units``, ``memory_units``) change no cycle count either: they are
what a mapped schedule (:mod:`stepsim.mapping`) is constrained by, the chip's compute units (each
``peak_flops_per_cycle / compute_units`` FLOPs/cycle) and memory units (each ``on_chip_capacity_bytes /
memory_units`` bytes). Both kinds join a run's identity (:meth:`Hardware.values`) only when they differ from their
defaults, so every run id from before they existed is unchanged.

Example
-------
>>> hw = Hardware.preset("step-eval", pmu_bw=512)
>>> hw.hbm_peak_bytes_per_cycle
1024
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

from stepsim.base.defaults import PRESET_CHANNEL_DEPTH, UNBOUNDED_CHANNEL_DEPTH, depth_elements
from stepsim.base.errors import ConfigError

#: step-perf's DEFAULT_CHAN_SIZE: what ``channel_depth=None`` means (bounded, not unbounded)
DEFAULT_CHANNEL_SIZE = UNBOUNDED_CHANNEL_DEPTH
#: separates a preset's name from the fields set over it in a derived name (``step-eval+hbm_channels=4``)
OVERRIDE_MARK = "+"


@dataclass(frozen=True)
class Hardware:
    """Accelerator parameters used by the engine.

    Parameters
    ----------
    name : str
        Label (the preset name by default).
    addr_offset : int
        Bytes per HBM request (64).
    hbm_channels : int
        Number of independent HBM channels.
    hbm_latency : int
        Per-channel latency (cycles).
    hbm_init_interval : int
        Cycles between two requests accepted by one channel.
    hbm_start_up : int
        Start-up cycles, charged on every request (step-perf never clears its flag).
    hbm_outstanding : int
        Stored for completeness; step-perf ignores it.
    pmu_bw : int
        On-chip memory-unit bandwidth (bytes/cycle), shared by reads and writes.
    channel_depth : int or None
        Default FIFO capacity (elements) of op-to-op channels; ``None`` means 1024 (step-perf's default). A
        preset's value yields to a workload's own depth; a value set explicitly (see ``explicit``) overrides it
        (precedence: :mod:`stepsim.base.defaults`).
    clock_hz : int
        Clock frequency (Hz): cycles to seconds. Default 1 GHz (step-perf counts cycles only).
    hbm_capacity_bytes : int
        Off-chip (HBM) capacity (bytes): weights plus the KV cache of a serve run. Default 64 GiB.
    on_chip_capacity_bytes : int
        On-chip memory capacity (bytes, all memory units): a serving layer needing more is refused. Default
        520 MiB.
    peak_flops_per_cycle : int
        Peak compute of the whole chip (FLOPs per cycle). Default 638,000 (638 TFLOP/s at 1 GHz).
    compute_units : int
        Compute units (PCUs) a mapped schedule spreads its compute operators over; each does
        :attr:`unit_flops_per_cycle`. Default 1,040 (SN40L).
    memory_units : int
        On-chip memory units (PMUs) a mapped schedule spreads its buffers and memory streams over; each holds
        :attr:`memory_unit_bytes` and moves ``pmu_bw`` bytes/cycle. Default 1,040 (SN40L).
    explicit : tuple of str
        Fields set over the base preset (TOML keys, overrides, constructor values that differ from the preset),
        sorted. Filled in automatically; decides the derived name and the FIFO-depth precedence.
    """

    name: str = "step-eval"
    addr_offset: int = 64
    hbm_channels: int = 32
    hbm_latency: int = 2
    hbm_init_interval: int = 2
    hbm_start_up: int = 14
    hbm_outstanding: int = 1
    pmu_bw: int = 64
    channel_depth: int | None = PRESET_CHANNEL_DEPTH["step-eval"]
    clock_hz: int = 1_000_000_000
    hbm_capacity_bytes: int = 64 * 2**30
    on_chip_capacity_bytes: int = 1040 * 512 * 2**10
    peak_flops_per_cycle: int = 638_000
    compute_units: int = 1040
    memory_units: int = 1040
    explicit: tuple = dc_field(default=())

    def __post_init__(self):
        for field in ("addr_offset", "hbm_channels", "hbm_init_interval", "pmu_bw") + SERVING_FIELDS + RESOURCE_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # TOML true is not 1 Hz
                raise ConfigError(f"hardware {self.name!r}: {field} must be a positive int, got {value!r}")
        for field in ("hbm_latency", "hbm_start_up", "hbm_outstanding"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"hardware {self.name!r}: {field} must be a non-negative int, got {value!r}")
        if self.channel_depth is not None and (isinstance(self.channel_depth, bool) or
                                               not isinstance(self.channel_depth, int) or self.channel_depth < 1):
            raise ConfigError(f"hardware {self.name!r}: channel_depth must be None or an int >= 1, "
                              f"got {self.channel_depth!r}")
        for field in ("addr_offset", "hbm_channels", "hbm_init_interval", "pmu_bw", "hbm_latency", "hbm_start_up",
                      "hbm_outstanding", "channel_depth"):
            value = getattr(self, field)
            if value is not None and value > 2**31 - 1:  # beyond it the engine's int64 products overflow
                raise ConfigError(f"hardware {self.name!r}: {field} must be at most 2,147,483,647 (2**31 - 1), "
                                  f"got {value!r}")
        self._record_explicit()

    def _record_explicit(self) -> None:
        """Complete ``explicit`` with the fields that differ from the base preset; derive the name from them.

        The base preset is the one the name starts with (``step-eval`` for ``step-eval+pmu_bw=512``); a name
        that names no preset was chosen by the user and is kept.
        """
        presets = globals().get("PRESETS")
        if presets is None:  # building the presets themselves
            return
        base_name = self.name.split(OVERRIDE_MARK, 1)[0]
        base = presets.get(base_name)
        explicit = set(self.explicit)
        if base is not None:
            explicit |= {f for f in VALUE_FIELDS if getattr(self, f) != getattr(base, f)}
        unknown = explicit - set(VALUE_FIELDS)
        if unknown:
            raise ConfigError(f"hardware {self.name!r}: explicit names unknown field(s) {', '.join(sorted(unknown))}")
        object.__setattr__(self, "explicit", tuple(sorted(explicit)))
        if base is not None:
            object.__setattr__(self, "name", derived_name(base_name, self))

    # ------------------------------------------------------------------------------------------ derived
    @property
    def default_channel_capacity(self) -> int:
        """FIFO capacity (elements) used when a channel gives none: ``channel_depth`` or 1024."""
        return depth_elements(self.channel_depth)

    def values(self) -> dict[str, Any]:
        """The fields that determine a run: every engine field, and each serving field that differs from its
        default (so run ids from before the serving fields existed stay as they were)."""
        values = {f: getattr(self, f) for f in ENGINE_FIELDS}
        values.update({f: getattr(self, f) for f in SERVING_FIELDS + RESOURCE_FIELDS
                       if getattr(self, f) != SERVING_DEFAULTS[f]})
        return values

    def seconds(self, cycles: int) -> float:
        """``cycles`` at ``clock_hz``, in seconds."""
        return cycles / self.clock_hz

    def check_on_chip(self, needed_bytes: int, what: str) -> None:
        """Raise a one-line :class:`ConfigError` when ``needed_bytes`` of on-chip memory exceed the capacity,
        saying by how much."""
        if needed_bytes > self.on_chip_capacity_bytes:
            raise ConfigError(f"{what} needs {needed_bytes:,} bytes on chip; hardware {self.name!r} has "
                              f"{self.on_chip_capacity_bytes:,} ({needed_bytes - self.on_chip_capacity_bytes:,} "
                              "bytes short)")

    @property
    def unit_flops_per_cycle(self) -> int:
        """FLOPs/cycle of one compute unit: ``peak_flops_per_cycle // compute_units`` (at least 1)."""
        return max(1, self.peak_flops_per_cycle // self.compute_units)

    @property
    def memory_unit_bytes(self) -> int:
        """Bytes one on-chip memory unit holds: ``on_chip_capacity_bytes // memory_units`` (at least 1)."""
        return max(1, self.on_chip_capacity_bytes // self.memory_units)

    @property
    def hbm_peak_bytes_per_cycle(self) -> int:
        """Peak HBM bandwidth (bytes/cycle): ``hbm_channels * addr_offset / hbm_init_interval``."""
        return self.hbm_channels * self.addr_offset // self.hbm_init_interval

    # ------------------------------------------------------------------------------------------ factories
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Hardware:
        """A named preset (``step-eval`` or ``step-hdl``) with optional field overrides.

        Raises
        ------
        ConfigError
            Unknown preset name or unknown override key.
        """
        if name not in PRESETS:
            raise ConfigError(f"unknown hardware preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
        base = PRESETS[name]
        _check_keys(overrides, where="overrides")
        return _over(base, overrides) if overrides else base  # frozen: the preset itself can be shared

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "dict") -> Hardware:
        """Build from a mapping; an optional ``preset`` key picks the base, other keys override it.

        Raises
        ------
        ConfigError
            Unknown key or preset, or a bad value (the message names the key and ``source``).
        """
        data = dict(data)
        preset = data.pop("preset", None)
        _check_keys(data, where=source)
        if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
            raise ConfigError(f"{source}: unknown hardware preset {preset!r}; "
                              f"known presets: {', '.join(sorted(PRESETS))}")
        try:
            return _over(PRESETS[preset or "step-eval"], data)
        except ConfigError as exc:  # a bad value: say which file (or mapping) it came from
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_toml(cls, path: str | Path) -> Hardware:
        """Read a TOML file (top-level keys, or a ``[hardware]`` table).

        Raises
        ------
        ConfigError
            Unreadable file, invalid TOML or unknown key (the message names the file and key).
        """
        path = Path(path)
        from stepsim.base.files import refuse_special_file

        refuse_special_file(path, ConfigError, "a hardware")
        try:
            stat = path.stat()
            key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
            if key in _TOML_CACHE:  # a sweep resolves one file per task: parse it once per version of the file
                return _TOML_CACHE[key]
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read hardware config {path}: {exc}") from exc
        if "hardware" in data and isinstance(data["hardware"], dict):
            data = data["hardware"]
        hardware = cls.from_dict(data, source=str(path))
        _TOML_CACHE[key] = hardware
        return hardware

    def to_dict(self) -> dict[str, Any]:
        """``{"preset": base, <explicit fields>}`` (plus ``name`` when it is not derived); round-trips through
        :meth:`from_dict`. :meth:`values` gives every value."""
        base_name = self.name.split(OVERRIDE_MARK, 1)[0]
        if base_name in PRESETS:
            return {"preset": base_name, **{f: getattr(self, f) for f in self.explicit}}
        return {"name": self.name, **self.values()}


#: parsed hardware files by (resolved path, size, mtime in ns)
_TOML_CACHE: dict[tuple[str, int, int], Hardware] = {}

_FIELDS = {f.name for f in dataclasses.fields(Hardware)} - {"explicit"}
#: the fields that determine a run (not labels or bookkeeping)
VALUE_FIELDS = tuple(f.name for f in dataclasses.fields(Hardware) if f.name not in ("name", "explicit"))
#: the serving fields: no cycle count depends on them
SERVING_FIELDS = ("clock_hz", "hbm_capacity_bytes", "on_chip_capacity_bytes", "peak_flops_per_cycle")
#: the resource fields a mapped schedule is constrained by (:mod:`stepsim.mapping`): no cycle count depends on them
RESOURCE_FIELDS = ("compute_units", "memory_units")
#: the defaults of both (the dataclass's)
SERVING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Hardware)
                    if f.name in SERVING_FIELDS + RESOURCE_FIELDS}
#: the fields the engine reads (and ``hbm_outstanding``, kept for the artifact's files): always in a run's identity
ENGINE_FIELDS = tuple(f for f in VALUE_FIELDS if f not in SERVING_FIELDS + RESOURCE_FIELDS)


def derived_name(base_name: str, hw: Hardware) -> str:
    """``base`` or ``base+field=value,...`` over the explicitly set fields (sorted), e.g. ``step-eval+hbm_channels=4``."""
    if not hw.explicit:
        return base_name
    return base_name + OVERRIDE_MARK + ",".join(f"{f}={getattr(hw, f)}" for f in hw.explicit)


def _over(base: Hardware, overrides: dict[str, Any]) -> Hardware:
    """``base`` with ``overrides`` applied and recorded as explicit (a given ``name`` is kept as is)."""
    overrides = dict(overrides)
    explicit = tuple(sorted(set(base.explicit) | (set(overrides) - {"name"})))
    return dataclasses.replace(base, **overrides, explicit=explicit)


def _check_keys(data: dict[str, Any], *, where: str) -> None:
    for key in data:
        if key not in _FIELDS:
            raise ConfigError(f"{where}: unknown hardware key {key!r}; known keys: {', '.join(sorted(_FIELDS))}")


PRESETS: dict[str, Hardware] = {
    "step-eval": Hardware(name="step-eval", addr_offset=64, hbm_channels=32, hbm_latency=2, hbm_init_interval=2,
                          hbm_start_up=14, hbm_outstanding=1, pmu_bw=64,
                          channel_depth=PRESET_CHANNEL_DEPTH["step-eval"]),
    "step-hdl": Hardware(name="step-hdl", addr_offset=64, hbm_channels=8, hbm_latency=2, hbm_init_interval=2,
                         hbm_start_up=14, hbm_outstanding=1, pmu_bw=256,
                         channel_depth=PRESET_CHANNEL_DEPTH["step-hdl"]),
    # one SN40L socket from its public specifications (every number and its source: docs/hardware.md). The
    # clock is not published: 1 GHz is assumed, which makes the published 1.6 TB/s HBM bandwidth 1600 B/cycle
    # (50 channels of 64 B every 2 cycles) and 638 TFLOP/s 638,000 FLOPs/cycle.
    "sn40l": Hardware(name="sn40l", addr_offset=64, hbm_channels=50, hbm_latency=2, hbm_init_interval=2,
                      hbm_start_up=14, hbm_outstanding=1, pmu_bw=64,
                      channel_depth=PRESET_CHANNEL_DEPTH["step-eval"], clock_hz=1_000_000_000,
                      hbm_capacity_bytes=64 * 2**30, on_chip_capacity_bytes=1040 * 512 * 2**10,
                      peak_flops_per_cycle=638_000, compute_units=1040, memory_units=1040),
}
