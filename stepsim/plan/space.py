"""The deployment space of ``stepsim plan``: chips per replica, replicas behind a router, and the scheduler's knobs
(docs/plan.md §1).

A deployment is ``replicas`` copies of one replica behind a router, each replica ``chips_per_replica`` chips
serving the whole model with its own scheduler and KV cache. How a replica's chips split the model is what
``stepsim serve --system`` builds (docs/serving.md §13): an MoE model's routed experts by expert parallelism, every
other weight by tensor parallelism; a dense model by tensor parallelism. The serve API has no pipeline stages and
no other split, so the split is not a knob here (it is recorded as ``parallelism``). A replica of c > 1 chips is
the ring system of c chips (:data:`SYSTEMS`).

The space comes from :data:`DEFAULT_SPACE` or a ``--space`` file (TOML or JSON) with the same keys::

    chips_per_replica = [1, 2, 4]
    replicas = [1, 2, 3, 4]
    routers = ["round-robin", "least-outstanding", "kv-load"]
    [[scheduler]]
    policy = "vllm"
    max_seqs = [32, 128]
    max_batch_tokens = [512, 2048]
    chunk_tokens = [0]

A deployment may also be disaggregated (issue 42; :mod:`stepsim.plan.disaggregated`): a replica of ``P + D`` chips
whose first ``P`` chips prefill and next ``D`` decode, the KV cache moved over the system's links (``stepsim serve
--disaggregate P:D``). The key ``disaggregated = [[1, 1], [2, 2]]`` lists the splits tried (default none: every
deployment colocated); ``P + D`` must be a replica size of :data:`SYSTEMS`.

A key left out takes the default's value; every value is checked with one line naming the file and the key.
Deployments whose chips (``chips_per_replica x replicas``) exceed ``--max-chips`` are left out.
"""

from __future__ import annotations

import itertools
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from stepsim.base.errors import ConfigError

#: routers of a deployment with several replicas (one replica needs none: "none")
ROUTERS = ("round-robin", "least-outstanding", "kv-load")
#: scheduler policies (stepsim.serve.scheduler)
POLICIES = ("vllm", "sarathi", "orca")
#: the system a replica of c chips is served on (system presets, docs/system.md): ring links of 64 B/cycle, 500 cycles
SYSTEMS = {2: "ring-2", 4: "ring-4", 8: "sn40l-8", 16: "sn40l-16"}
#: chips per replica the serve API serves (1: no system)
CHIP_COUNTS = (1, *SYSTEMS)
#: each policy's knobs (and the values the default space tries)
POLICY_KNOBS = {"vllm": ("max_seqs", "max_batch_tokens", "chunk_tokens"), "sarathi": ("max_seqs", "chunk_tokens"),
                "orca": ("max_seqs",)}
#: the default space: 7 scheduler settings; up to 4 chips it holds 105 deployments
DEFAULT_SPACE = {
    "chips_per_replica": [1, 2, 4, 8, 16],
    "replicas": list(range(1, 17)),
    "routers": list(ROUTERS),
    "scheduler": [
        {"policy": "vllm", "max_seqs": [32, 128], "max_batch_tokens": [2048], "chunk_tokens": [0]},
        {"policy": "vllm", "max_seqs": [128], "max_batch_tokens": [512], "chunk_tokens": [0]},
        {"policy": "sarathi", "max_seqs": [128], "chunk_tokens": [256, 512]},
        {"policy": "orca", "max_seqs": [32, 128]},
    ],
    "disaggregated": [],
}
#: top-level keys of a space file
SPACE_KEYS = ("chips_per_replica", "replicas", "routers", "scheduler", "disaggregated")
#: the largest value of an integer knob (tokens, sequences, replicas)
MAX_KNOB = 2**31 - 1


@dataclass(frozen=True, order=True)
class SchedulerChoice:
    """One scheduler setting: ``policy`` and its knobs (None where the policy has no such knob)."""

    policy: str
    max_seqs: int
    max_batch_tokens: int | None = None
    chunk_tokens: int | None = None

    def serve_kwargs(self) -> dict:
        """Keyword arguments of :func:`stepsim.serve` for this setting."""
        out = {"scheduler": self.policy, "max_seqs": self.max_seqs}
        if self.max_batch_tokens is not None:
            out["max_batch_tokens"] = self.max_batch_tokens
        if self.chunk_tokens is not None:
            out["chunk_tokens"] = self.chunk_tokens
        return out

    def label(self) -> str:
        parts = [self.policy, f"seqs {self.max_seqs}"]
        if self.max_batch_tokens is not None:
            parts.append(f"batch {self.max_batch_tokens}")
        if self.chunk_tokens:
            parts.append(f"chunk {self.chunk_tokens}")
        return " ".join(parts)


@dataclass(frozen=True, order=True)
class Deployment:
    """``replicas`` replicas of ``chips_per_replica`` chips of ``hardware`` behind ``router``, each scheduled by
    ``scheduler``."""

    chips_per_replica: int
    replicas: int
    router: str
    scheduler: SchedulerChoice
    hardware: str = "sn40l"
    disaggregate: tuple = ()  # (P, D): prefill and decode chips of each replica; () colocated

    @property
    def chips(self) -> int:
        """Chips of the whole deployment."""
        return self.chips_per_replica * self.replicas

    @property
    def system(self) -> str | None:
        """The system preset a replica is served on (None: one chip)."""
        return SYSTEMS.get(self.chips_per_replica)

    def label(self) -> str:
        """A short unique name, e.g. ``2x2ch sn40l least-outstanding vllm seqs 128 batch 2048``."""
        split = f" disagg {self.disaggregate[0]}:{self.disaggregate[1]}" if self.disaggregate else ""
        return (f"{self.replicas}x{self.chips_per_replica}ch{split} {self.hardware} {self.router} "
                f"{self.scheduler.label()}")


def _where(source) -> str:
    return str(source) if source is not None else "the space"


def _int_list(value, key: str, source, lo: int, hi: int = MAX_KNOB) -> list[int]:
    ok = isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
                                                   for v in value)
    if not ok:
        raise ConfigError(f"{_where(source)}: {key} must be a non-empty list of integers in {lo}..{hi}, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{_where(source)}: {key} lists a value twice: {value!r}")
    return list(value)


def parse_space(data, source=None) -> dict:
    """A checked space (module docstring): the default's values for the keys ``data`` leaves out. One line naming
    ``source`` and the key for anything else than the documented keys and values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{_where(source)}: a space is a table of keys ({', '.join(SPACE_KEYS)}), got "
                          f"{type(data).__name__}")
    for key in data:
        if key not in SPACE_KEYS:
            raise ConfigError(f"{_where(source)}: unknown key {key!r} (known: {', '.join(SPACE_KEYS)})")
    space = {**DEFAULT_SPACE, **data}
    chips = space["chips_per_replica"]
    if not (isinstance(chips, list) and chips and all(c in CHIP_COUNTS and not isinstance(c, bool) for c in chips)):
        raise ConfigError(f"{_where(source)}: chips_per_replica must be a non-empty list of "
                          f"{', '.join(map(str, CHIP_COUNTS))} (the systems serve builds), got {chips!r}")
    _int_list(chips, "chips_per_replica", source, 1)
    _int_list(space["replicas"], "replicas", source, 1, 4096)
    routers = space["routers"]
    if not (isinstance(routers, list) and routers and all(r in ROUTERS for r in routers)) or \
            len(set(routers)) != len(routers):
        raise ConfigError(f"{_where(source)}: routers must be a non-empty list of distinct {', '.join(ROUTERS)}, "
                          f"got {routers!r}")
    tables = space["scheduler"]
    if not (isinstance(tables, list) and tables and all(isinstance(t, dict) for t in tables)):
        raise ConfigError(f"{_where(source)}: scheduler must be a non-empty list of tables ([[scheduler]]), "
                          f"got {tables!r}")
    for i, table in enumerate(tables):
        where = f"scheduler[{i}]"
        policy = table.get("policy")
        if policy not in POLICIES:
            raise ConfigError(f"{_where(source)}: {where}.policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        for key, value in table.items():
            if key == "policy":
                continue
            if key not in POLICY_KNOBS[policy]:
                raise ConfigError(f"{_where(source)}: {where}: unknown key {key!r} for policy {policy} (known: "
                                  f"policy, {', '.join(POLICY_KNOBS[policy])})")
            _int_list(value, f"{where}.{key}", source, 0 if key == "chunk_tokens" else 1)
        if "max_seqs" not in table:
            raise ConfigError(f"{_where(source)}: {where}.max_seqs is required (a list of integers >= 1)")
    from stepsim.plan.disaggregated import check_splits

    check_splits(space["disaggregated"], _where(source), SYSTEMS)
    return space


def load_space(path) -> dict:
    """Read and check a ``--space`` file: ``.json`` as JSON, anything else as TOML."""
    from stepsim.base.files import refuse_special_file

    path = Path(path)
    refuse_special_file(path, ConfigError, "a space")
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"--space {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--space {path}: a folder, not a file") from None
    except OSError as exc:
        raise ConfigError(f"--space {path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise ConfigError(f"--space {path}: not valid {kind}: {str(exc).splitlines()[0]}") from None
    return parse_space(data, source=path)


def scheduler_choices(space: dict) -> list[SchedulerChoice]:
    """Every scheduler setting of the space, in file order (each table's knobs as a grid, last knob fastest)."""
    out = []
    for table in space["scheduler"]:
        policy = table["policy"]
        knobs = [k for k in POLICY_KNOBS[policy] if k in table]
        for values in itertools.product(*(table[k] for k in knobs)):
            choice = SchedulerChoice(policy, **dict(zip(knobs, values)))
            if choice not in out:
                out.append(choice)
    return out


def deployments(space: dict, max_chips: int, hardware: list[str]) -> list[Deployment]:
    """Every deployment of ``space`` on at most ``max_chips`` chips, for each of ``hardware``; a replica of one
    chip needs no router (``none``)."""
    out = []
    for hw in hardware:
        for chips in sorted(space["chips_per_replica"]):
            for replicas in sorted(space["replicas"]):
                if chips * replicas > max_chips:
                    continue
                routers = ["none"] if replicas == 1 else list(space["routers"])
                for router in routers:
                    for choice in scheduler_choices(space):
                        out.append(Deployment(chips, replicas, router, choice, hw))
        for p, d in space.get("disaggregated", ()):  # after the colocated ones: their order is kept
            for replicas in sorted(space["replicas"]):
                if (p + d) * replicas > max_chips:
                    continue
                for router in ["none"] if replicas == 1 else list(space["routers"]):
                    for choice in scheduler_choices(space):
                        out.append(Deployment(p + d, replicas, router, choice, hw, (p, d)))
    return out
