"""A multi-chip system: how many chips, which hardware each has, and the links between them (docs/system.md).

A system file is TOML. The one-dimension form is top-level keys::

    chips = 8
    hardware = "step-eval"          # a hardware preset or a hardware .toml file (relative to this file)
    topology = "ring"               # "ring", "fully-connected", "switch" or "custom"
    link_bandwidth = 64             # bytes/cycle, per link and direction
    link_latency = 500              # cycles

More dimensions are ``[[dimension]]`` tables (``size``, ``topology``, ``link_bandwidth``, ``link_latency``;
the product of the sizes is the chip count, dimension 0 varies fastest in the chip id). ``topology = "custom"``
lists its links as ``[[link]]`` tables (``src``, ``dst``, optional ``bandwidth``, ``latency``,
``bidirectional`` = true). Every problem is one :class:`~stepsim.base.errors.SystemConfigError` line naming the file
and the key.

Example
-------
>>> s = System.preset("ring-4")
>>> [link.name for link in s.links][:2], s.route(0, 2)
(['chip0->chip1', 'chip1->chip2'], (0, 1))
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepsim.base.errors import ConfigError, SystemConfigError
from stepsim.base.hardware import PRESETS as HARDWARE_PRESETS
from stepsim.base.hardware import Hardware
from stepsim.base.system.topology import TOPOLOGIES, Link, Routes, group_members, node_name, topology_pairs

#: the most chips a system may have (the engine has one unit per link; beyond this the tables get unwieldy)
MAX_CHIPS = 4096
#: the most directed links a system may have: each is a unit of the engine and a Link record (a fully-connected
#: dimension of n chips has n (n - 1): 512 chips are 261,632 links, built in about 1.5 s; 4,096 would be 16.8
#: million, gigabytes before the first cycle)
MAX_LINKS = 2**18
#: the least link latency (cycles): one for the on-chip edge from the sending operator into the link, at least one
#: on the link itself (the engine's Link unit gets ``latency - 1``; see stepsim.graph.network)
MIN_LATENCY = 2
#: beyond it the engine's int64 products of bytes and cycles could overflow (as for the hardware fields)
MAX_VALUE = 2**31 - 1

_TOP_KEYS = {"name", "chips", "hardware", "topology", "link_bandwidth", "link_latency", "dimension", "link"}
_DIM_KEYS = {"size", "topology", "link_bandwidth", "link_latency"}
_LINK_KEYS = {"src", "dst", "bandwidth", "latency", "bidirectional"}


@dataclass(frozen=True)
class Dimension:
    """One dimension of the chip grid: ``size`` chips per group linked by ``topology``.

    ``link_bandwidth`` in bytes/cycle, ``link_latency`` in cycles (both per link and direction).
    """

    size: int
    topology: str
    link_bandwidth: int
    link_latency: int


@dataclass(frozen=True)
class System:
    """Chips, their hardware and their links.

    Parameters
    ----------
    name : str
        Label (the preset's or file's name).
    chips : int
        Number of chips (>= 1).
    hardware : Hardware
        Every chip's hardware.
    dimensions : tuple of Dimension
        The grid (empty for ``custom``).
    links : tuple of Link
        Every directed link; switches are nodes ``chips ..``.
    n_switches : int
        Number of switch nodes.
    hardware_spec : str
        The hardware as a preset name or the absolute path of its TOML file (what ``--hardware`` would take).
    """

    name: str
    chips: int
    hardware: Hardware
    dimensions: tuple[Dimension, ...]
    links: tuple[Link, ...]
    n_switches: int = 0
    hardware_spec: str = "step-eval"
    _routes: Routes | None = field(default=None, repr=False, compare=False)

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link indices a transfer from chip ``src`` to chip ``dst`` crosses, in order (empty if src == dst)."""
        if src == dst:
            return ()
        if self._routes is None:  # built directly rather than by from_dict: find the routes now
            object.__setattr__(self, "_routes", Routes(self.links, self.chips, self.chips + self.n_switches))
        path = self._routes.route(src, dst)
        if path is None:
            raise SystemConfigError(f"system {self.name!r}: chip {dst} is unreachable from chip {src}")
        return path

    def node_name(self, node: int) -> str:
        """``chipN`` or ``switchK``."""
        return node_name(node, self.chips)

    def link(self, src: int, dst: int) -> Link:
        """The direct link ``src -> dst`` between two nodes (SystemConfigError if there is none)."""
        for link in self.links:
            if link.src == src and link.dst == dst:
                return link
        raise SystemConfigError(f"system {self.name!r}: no link {self.node_name(src)}->{self.node_name(dst)}")

    # ---------------------------------------------------------------------------------------- factories
    @classmethod
    def preset(cls, name: str) -> System:
        """A named preset (see :data:`PRESETS`)."""
        if name not in PRESETS:
            raise SystemConfigError(f"unknown system preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
        return from_dict(PRESETS[name], source=f"preset {name}", name=name)

    @classmethod
    def load(cls, spec: str | Path) -> System:
        """A preset name or a TOML file path (a name that is neither: the unknown-preset error)."""
        if isinstance(spec, str) and not spec.endswith(".toml") and not Path(spec).is_file():
            return cls.preset(spec)
        return from_toml(spec)


def from_toml(path: str | Path) -> System:
    """Read a system file. Raises SystemConfigError (one line naming the file and the key)."""
    path = Path(path)
    from stepsim.base.files import refuse_special_file  # (numpy-free callers load systems too)

    refuse_special_file(path, SystemConfigError, "a system")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SystemConfigError(f"cannot read system file {path}: {exc}") from None
    return from_dict(data, source=str(path), base_dir=path.parent, name=data.get("name", path.stem))


def _int(value: Any, where: str, key: str, minimum: int, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value > MAX_VALUE:
        raise SystemConfigError(f"{where}: {key} must be an int in {minimum}..{MAX_VALUE} ({unit}), got {value!r}")
    return value


def _hardware(value: Any, where: str, base_dir: Path | None) -> tuple[Hardware, str]:
    """The chips' hardware and how to name it again: a preset name or the hardware file's absolute path."""
    if not isinstance(value, str):
        raise SystemConfigError(f"{where}: hardware must be a preset name or a hardware TOML file, got {value!r}")
    if value in HARDWARE_PRESETS:
        return Hardware.preset(value), value
    path = Path(value)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if not path.is_file() or path.suffix != ".toml":
        raise SystemConfigError(f"{where}: hardware {value!r} is neither a preset "
                                f"({', '.join(sorted(HARDWARE_PRESETS))}) nor a .toml file")
    try:
        return Hardware.from_toml(path), str(path.resolve())
    except ConfigError as exc:
        raise SystemConfigError(f"{where}: {exc}") from None


def _check_keys(data: dict, allowed: set, where: str, what: str) -> None:
    for key in data:
        if key not in allowed:
            raise SystemConfigError(f"{where}: unknown {what} key {key!r}; known keys: {', '.join(sorted(allowed))}")


def _topology(value: Any, where: str) -> str:
    if value not in TOPOLOGIES:
        raise SystemConfigError(f"{where}: topology must be one of {', '.join(repr(t) for t in TOPOLOGIES)}, "
                                f"got {value!r}")
    return value


def _dimensions(data: dict, chips: int | None, where: str) -> tuple[Dimension, ...]:
    """The grid of a ring / fully-connected / switch system."""
    if "dimension" in data:
        for key in ("topology", "link_bandwidth", "link_latency"):
            if key in data:
                raise SystemConfigError(f"{where}: {key} is given per [[dimension]] when there are dimensions; "
                                        f"remove the top-level {key}")
        tables = data["dimension"]
        if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
            raise SystemConfigError(f"{where}: dimension must be a list of [[dimension]] tables")
        dims = []
        for i, table in enumerate(tables):
            at = f"{where} dimension {i}"
            _check_keys(table, _DIM_KEYS, at, "dimension")
            for key in _DIM_KEYS:
                if key not in table:
                    raise SystemConfigError(f"{at}: missing key {key!r}")
            topology = _topology(table["topology"], at)
            if topology == "custom":
                raise SystemConfigError(f"{at}: topology 'custom' is for a whole system, not a dimension")
            dims.append(Dimension(_int(table["size"], at, "size", 1, "chips"), topology,
                                  _int(table["link_bandwidth"], at, "link_bandwidth", 1, "bytes/cycle"),
                                  _int(table["link_latency"], at, "link_latency", MIN_LATENCY, "cycles")))
        product = 1
        for d in dims:
            product *= d.size
        if chips is not None and chips != product:
            raise SystemConfigError(f"{where}: chips = {chips} but the dimensions' sizes multiply to {product}")
        return tuple(dims)
    if chips is None:
        raise SystemConfigError(f"{where}: missing key 'chips'")
    for key in ("topology", "link_bandwidth", "link_latency"):
        if key not in data:
            raise SystemConfigError(f"{where}: missing key {key!r}")
    return (Dimension(chips, _topology(data["topology"], where),
                      _int(data["link_bandwidth"], where, "link_bandwidth", 1, "bytes/cycle"),
                      _int(data["link_latency"], where, "link_latency", MIN_LATENCY, "cycles")),)


def grid_link_count(dims: tuple[Dimension, ...], chips: int) -> int:
    """The directed links :func:`_grid_links` makes, counted without making them."""
    total = 0
    for dim in dims:
        k = dim.size
        per_group = {"ring": 0 if k == 1 else 2 if k == 2 else 2 * k, "fully-connected": k * (k - 1),
                     "switch": 0 if k == 1 else 2 * k}[dim.topology]
        total += per_group * (chips // k)
    return total


def _check_link_count(dims: tuple[Dimension, ...], chips: int, where: str) -> None:
    """Refuse a grid with more than :data:`MAX_LINKS` links before any is made (one line with the count)."""
    count = grid_link_count(dims, chips)
    if count > MAX_LINKS:
        what = " x ".join(f"{d.topology} of {d.size}" for d in dims)
        raise SystemConfigError(f"{where}: topology ({what}) makes {count:,} links; the limit is {MAX_LINKS:,} "
                                f"(each link is an engine unit): use a 'switch' or 'ring' topology, or fewer chips")


def _grid_links(dims: tuple[Dimension, ...], chips: int) -> tuple[tuple[Link, ...], int]:
    sizes = tuple(d.size for d in dims)
    raw: list[tuple[int, int, int, int]] = []
    n_switches = 0
    for di, dim in enumerate(dims):
        for members in group_members(sizes, di):
            if dim.topology == "switch":
                if dim.size == 1:
                    continue
                switch = chips + n_switches
                n_switches += 1
                for chip in members:
                    raw.append((chip, switch, dim.link_bandwidth, dim.link_latency))
                    raw.append((switch, chip, dim.link_bandwidth, dim.link_latency))
            else:
                for i, j in topology_pairs(dim.topology, dim.size):
                    raw.append((members[i], members[j], dim.link_bandwidth, dim.link_latency))
    links = tuple(Link(k, s, d, bw, lat, f"{node_name(s, chips)}->{node_name(d, chips)}")
                  for k, (s, d, bw, lat) in enumerate(raw))
    return links, n_switches


def _custom_links(data: dict, chips: int, where: str) -> tuple[Link, ...]:
    if "dimension" in data:
        raise SystemConfigError(f"{where}: topology 'custom' takes [[link]] tables, not [[dimension]]")
    tables = data.get("link")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise SystemConfigError(f"{where}: topology 'custom' needs [[link]] tables (src, dst)")
    raw: list[tuple[int, int, int, int]] = []
    seen = set()
    for i, table in enumerate(tables):
        at = f"{where} link {i}"
        _check_keys(table, _LINK_KEYS, at, "link")
        ends = []
        for key in ("src", "dst"):
            if key not in table:
                raise SystemConfigError(f"{at}: missing key {key!r}")
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < chips:
                raise SystemConfigError(f"{at}: {key} = {value!r} names no chip (chips are 0..{chips - 1})")
            ends.append(value)
        src, dst = ends
        if src == dst:
            raise SystemConfigError(f"{at}: links chip {src} to itself")
        bandwidth = table.get("bandwidth", data.get("link_bandwidth"))
        latency = table.get("latency", data.get("link_latency"))
        if bandwidth is None or latency is None:
            raise SystemConfigError(f"{at}: needs bandwidth and latency (or top-level link_bandwidth, link_latency)")
        bandwidth = _int(bandwidth, at, "bandwidth", 1, "bytes/cycle")
        latency = _int(latency, at, "latency", MIN_LATENCY, "cycles")
        both = table.get("bidirectional", True)
        if not isinstance(both, bool):
            raise SystemConfigError(f"{at}: bidirectional must be true or false, got {both!r}")
        for s, d in ((src, dst), (dst, src)) if both else ((src, dst),):
            if (s, d) in seen:
                raise SystemConfigError(f"{at}: link chip{s}->chip{d} is given twice")
            seen.add((s, d))
            raw.append((s, d, bandwidth, latency))
    return tuple(Link(k, s, d, bw, lat, f"chip{s}->chip{d}") for k, (s, d, bw, lat) in enumerate(raw))


def from_dict(data: dict[str, Any], *, source: str = "dict", base_dir: Path | None = None,
              name: str | None = None) -> System:
    """Build a system from a parsed TOML mapping. Raises SystemConfigError naming ``source`` and the key."""
    where = source
    _check_keys(data, _TOP_KEYS, where, "system")
    chips = data.get("chips")
    if chips is not None:
        chips = _int(chips, where, "chips", 1, "chips")
        if chips > MAX_CHIPS:
            raise SystemConfigError(f"{where}: chips must be at most {MAX_CHIPS}, got {chips}")
    hardware, hardware_spec = _hardware(data.get("hardware", "step-eval"), where, base_dir)
    if data.get("topology") == "custom":
        if chips is None:
            raise SystemConfigError(f"{where}: missing key 'chips'")
        dims: tuple[Dimension, ...] = ()
        links = _custom_links(data, chips, where)
        n_switches = 0
    else:
        if "link" in data:
            raise SystemConfigError(f"{where}: [[link]] tables need topology = 'custom'")
        dims = _dimensions(data, chips, where)
        chips = 1
        for d in dims:
            chips *= d.size
        if chips > MAX_CHIPS:
            raise SystemConfigError(f"{where}: chips must be at most {MAX_CHIPS}, got {chips}")
        _check_link_count(dims, chips, where)
        links, n_switches = _grid_links(dims, chips)
    table = Routes(links, chips, chips + n_switches)
    # a grid is connected by construction (every group of every dimension is); custom links may not be
    unreachable = table.first_unreachable() if data.get("topology") == "custom" else None
    if unreachable is not None:
        src, dst = unreachable
        raise SystemConfigError(f"{where}: chip {dst} is unreachable from chip {src} over the links")
    label = name if isinstance(name, str) else str(data.get("name", source))
    return System(label, chips, hardware, dims, links, n_switches, hardware_spec, table)


#: named systems (illustrative link figures: 64 B/cycle is 64 GB/s per direction at 1 GHz, 500 cycles 0.5 us)
PRESETS: dict[str, dict[str, Any]] = {
    **{f"ring-{n}": {"chips": n, "topology": "ring", "link_bandwidth": 64, "link_latency": 500} for n in (2, 4, 8)},
    "fully-connected-8": {"chips": 8, "topology": "fully-connected", "link_bandwidth": 64, "link_latency": 500},
    # SN40L sockets (docs/hardware.md) on a ring; SambaNova publishes no link figures, so the links are the
    # illustrative ones above (docs/validation.md says so beside every number they enter)
    **{f"sn40l-{n}": {"chips": n, "topology": "ring", "link_bandwidth": 64, "link_latency": 500, "hardware": "sn40l"}
       for n in (8, 16)},
    "switch-8": {"chips": 8, "topology": "switch", "link_bandwidth": 64, "link_latency": 250},
    "torus-4x4": {"dimension": [
        {"size": 4, "topology": "ring", "link_bandwidth": 64, "link_latency": 500},
        {"size": 4, "topology": "ring", "link_bandwidth": 64, "link_latency": 500}]},
}
