"""The system a parallel layer runs on (``--ep N``, ``--tp N``, ``--pp N``): the given one, or N fully connected
chips with the preset link figures (64 bytes/cycle, 500 cycles, as docs/system.md's presets)."""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.base.system import System, from_dict

#: links of the default system (fully connected): bytes/cycle and cycles, as the system presets
DEFAULT_LINK_BANDWIDTH = 64
DEFAULT_LINK_LATENCY = 500


def chips_system(chips: int, system: System | None, flag: str) -> System:
    """``system`` (its chip count must be ``chips``, else a one-line error naming ``flag``), else ``chips`` fully
    connected chips with the default links."""
    if system is None:
        name = f"fully-connected-{chips}"
        return from_dict({"name": name, "chips": chips, "topology": "fully-connected",
                          "link_bandwidth": DEFAULT_LINK_BANDWIDTH, "link_latency": DEFAULT_LINK_LATENCY},
                         source=flag, name=name)
    if system.chips != chips:
        raise ArgumentError(f"{flag} {chips} needs a system of {chips} chips; system {system.name!r} has "
                            f"{system.chips}")
    return system
