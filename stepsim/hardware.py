"""Hardware parameters of the simulated accelerator (HBM model, on-chip bandwidth, FIFO depth).

Two named presets reproduce the step-perf configurations of STEP_TIMING §2 / §3.2:

* ``step-eval``: ``HBMConfig(64, 32, 2, 2, 1, 14)``, 1024 B/cycle HBM peak, PMU 64 B/cycle, channel depth 2
  (the paper's evaluation setup).
* ``step-hdl``: ``HBMConfig(64, 8, 2, 2, 1, 14)``, 256 B/cycle HBM peak, PMU 256 B/cycle, channel depth 1
  (the HDL validation, README Fig. 8).

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
from pathlib import Path
from typing import Any

from stepsim.errors import ConfigError

#: step-perf's DEFAULT_CHAN_SIZE: what ``channel_depth=None`` means (bounded, not unbounded)
DEFAULT_CHANNEL_SIZE = 1024


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
        Default FIFO capacity (elements) of op-to-op channels; ``None`` means 1024 (step-perf's default).
    """

    name: str = "step-eval"
    addr_offset: int = 64
    hbm_channels: int = 32
    hbm_latency: int = 2
    hbm_init_interval: int = 2
    hbm_start_up: int = 14
    hbm_outstanding: int = 1
    pmu_bw: int = 64
    channel_depth: int | None = 2

    def __post_init__(self):
        for field in ("addr_offset", "hbm_channels", "hbm_init_interval", "pmu_bw"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"hardware {self.name!r}: {field} must be a positive int, got {value!r}")
        for field in ("hbm_latency", "hbm_start_up", "hbm_outstanding"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"hardware {self.name!r}: {field} must be a non-negative int, got {value!r}")
        if self.channel_depth is not None and (not isinstance(self.channel_depth, int) or self.channel_depth < 1):
            raise ConfigError(f"hardware {self.name!r}: channel_depth must be None or an int >= 1, "
                              f"got {self.channel_depth!r}")

    # ------------------------------------------------------------------------------------------ derived
    @property
    def default_channel_capacity(self) -> int:
        """FIFO capacity (elements) used when a channel gives none: ``channel_depth`` or 1024."""
        return DEFAULT_CHANNEL_SIZE if self.channel_depth is None else self.channel_depth

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
        return dataclasses.replace(base, **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "dict") -> Hardware:
        """Build from a mapping; an optional ``preset`` key picks the base, other keys override it.

        Raises
        ------
        ConfigError
            Unknown key (the message names the key and ``source``).
        """
        data = dict(data)
        preset = data.pop("preset", None)
        _check_keys(data, where=source)
        if preset is not None:
            if preset not in PRESETS:
                raise ConfigError(f"{source}: unknown hardware preset {preset!r}; "
                                  f"known presets: {', '.join(sorted(PRESETS))}")
            return dataclasses.replace(PRESETS[preset], **data)
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> Hardware:
        """Read a TOML file (top-level keys, or a ``[hardware]`` table).

        Raises
        ------
        ConfigError
            Unreadable file, invalid TOML or unknown key (the message names the file and key).
        """
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read hardware config {path}: {exc}") from exc
        if "hardware" in data and isinstance(data["hardware"], dict):
            data = data["hardware"]
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)


_FIELDS = {f.name for f in dataclasses.fields(Hardware)}


def _check_keys(data: dict[str, Any], *, where: str) -> None:
    for key in data:
        if key not in _FIELDS:
            raise ConfigError(f"{where}: unknown hardware key {key!r}; known keys: {', '.join(sorted(_FIELDS))}")


PRESETS: dict[str, Hardware] = {
    "step-eval": Hardware(name="step-eval", addr_offset=64, hbm_channels=32, hbm_latency=2, hbm_init_interval=2,
                          hbm_start_up=14, hbm_outstanding=1, pmu_bw=64, channel_depth=2),
    "step-hdl": Hardware(name="step-hdl", addr_offset=64, hbm_channels=8, hbm_latency=2, hbm_init_interval=2,
                         hbm_start_up=14, hbm_outstanding=1, pmu_bw=256, channel_depth=1),
}
