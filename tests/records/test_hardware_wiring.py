"""Every field of ``Hardware`` reaches what it should (the program, the FIFO depths, the record), and the FIFO
depth follows one precedence: knob > a hardware's explicit ``channel_depth`` > the workload's > the preset's.

The field test iterates ``dataclasses.fields(Hardware)``: a field added without saying (here) what it changes
fails it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stepsim.base.defaults import UNBOUNDED_CHANNEL_DEPTH
from stepsim.base.hardware import PRESETS, Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import abi
from stepsim.results.records import run_config, run_identity
from stepsim.simulation.simulate import simulate
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE
from stepsim.workloads.swiglu.build import build_swiglu

#: field -> the slot of the program's hardware vector it sets
HW_SLOTS = {"addr_offset": abi.HW_ADDR_OFFSET, "hbm_channels": abi.HW_HBM_CHANNELS,
            "hbm_latency": abi.HW_HBM_LATENCY, "hbm_init_interval": abi.HW_HBM_INIT_INTERVAL,
            "hbm_start_up": abi.HW_HBM_START_UP, "pmu_bw": abi.HW_PMU_BW}
#: fields that set no program value, and what they change instead
NOT_IN_PROGRAM = {
    "name": "the record's hardware_name",
    "channel_depth": "the capacity of every channel without its own depth",
    "hbm_outstanding": "nothing: step-perf ignores it (kept so the artifact's hardware files load); run id only",
    "explicit": "bookkeeping: whether channel_depth outranks a workload's depth",
    "clock_hz": "serving: cycles to seconds; run id only when not the default",
    "hbm_capacity_bytes": "serving: the KV cache's size; run id only when not the default",
    "on_chip_capacity_bytes": "serving: which layers fit on chip; run id only when not the default",
    "peak_flops_per_cycle": "serving: the compute bound of the fast model; run id only when not the default",
    "compute_units": "mapping: the compute units a schedule may use; run id only when not the default",
    "memory_units": "mapping: the memory units a schedule may use; run id only when not the default",
}
#: a value different from step-eval's for every field
OTHER_VALUE = {"name": "chip", "addr_offset": 32, "hbm_channels": 4, "hbm_latency": 5, "hbm_init_interval": 3,
               "hbm_start_up": 9, "hbm_outstanding": 4, "pmu_bw": 128, "channel_depth": 7,
               "clock_hz": 2_000_000_000, "hbm_capacity_bytes": 2**30, "on_chip_capacity_bytes": 2**20,
               "peak_flops_per_cycle": 1024, "compute_units": 64, "memory_units": 64}


def _program(hw: Hardware):
    return lower(build_swiglu(tile_m=32, tile_n=64).graph, hw)


def test_every_hardware_field_is_wired_to_what_it_changes():
    fields = [f.name for f in dataclasses.fields(Hardware)]
    unexplained = [f for f in fields if f not in HW_SLOTS and f not in NOT_IN_PROGRAM]
    assert unexplained == [], f"say what these Hardware fields change (and wire them): {unexplained}"
    base = PRESETS["step-eval"]
    base_program = _program(base)
    base_id = run_identity({"workload": "swiglu", "hardware": "step-eval", "mode": "simulate"})[0]
    for name in fields:
        if name == "explicit":
            continue
        hw = Hardware.from_dict({"preset": "step-eval", name: OTHER_VALUE[name]})
        program = _program(hw)
        if name in HW_SLOTS:
            assert program.hw[HW_SLOTS[name]] == OTHER_VALUE[name] != base_program.hw[HW_SLOTS[name]], name
        else:
            assert np.array_equal(program.hw, base_program.hw), name
        if name == "channel_depth":  # SwiGLU's channels carry no depth of their own: every one follows
            assert set(program.ch_capacity.tolist()) == {7} and set(base_program.ch_capacity.tolist()) == {2}
        else:
            assert np.array_equal(program.ch_capacity, base_program.ch_capacity), name
        config = {"workload": "swiglu", "mode": "simulate", "hardware": "step-eval"}
        if name == "name":  # a label: the record's hardware_name, not the run's identity
            assert hw.name == "chip" and _identity_with(config, hw) == base_id
        else:  # a value that determines the result is part of the run identity
            assert _identity_with(config, hw) != base_id, name
    assert run_config({"workload": "swiglu", "hardware": "step-hdl"}).row["hardware_name"] == "step-hdl"


def _identity_with(config: dict, hw: Hardware) -> str:
    """The run id ``config`` would have on ``hw`` (what run_identity computes from a hardware file)."""
    from stepsim.base.defaults import UNSET, resolve_channel_depth
    from stepsim.base.files import stable_hash
    from stepsim.results.records import identity, identity_config
    from stepsim.workloads.config import normalize_config

    cfg = normalize_config(config)
    depth = resolve_channel_depth(UNSET, hw, WORKLOAD_CHANNEL_DEPTH["swiglu"])
    return stable_hash(identity(identity_config(cfg, hw, depth), None))


def test_modified_hardware_is_never_named_after_its_preset(tmp_path):
    assert Hardware.preset("step-eval").name == "step-eval"
    assert Hardware.preset("step-eval", hbm_channels=4).name == "step-eval+hbm_channels=4"
    assert Hardware(hbm_channels=4, pmu_bw=32).name == "step-eval+hbm_channels=4,pmu_bw=32"
    hw = tmp_path / "hw.toml"
    hw.write_text('preset = "step-hdl"\nhbm_channels = 4\n')
    row = run_config({"workload": "swiglu", "hardware": str(hw)}).row
    assert row["hardware_name"] == "step-hdl+hbm_channels=4"
    assert row["hbm_bytes_per_cycle"] == 4 * 64 // 2
    named = tmp_path / "named.toml"
    named.write_text('preset = "step-hdl"\nname = "my-board"\nhbm_channels = 4\n')
    assert run_config({"workload": "swiglu", "hardware": str(named)}).row["hardware_name"] == "my-board"


# --- FIFO depth: one home for the defaults, one precedence -----------------------------------------------
def test_the_defaults_module_holds_what_the_builders_and_presets_use():
    from stepsim.workloads.attention.build import CHANNEL_DEPTH
    from stepsim.workloads.config import workload_from_config

    for kind in ("swiglu", "moe", "attention"):
        w = workload_from_config({"workload": kind})
        assert (w.channel_depth, w.hardware) == (WORKLOAD_CHANNEL_DEPTH[kind], WORKLOAD_HARDWARE[kind]), kind
    assert (WORKLOAD_CHANNEL_DEPTH, CHANNEL_DEPTH) == ({"swiglu": 1, "moe": 2, "attention": 1, "prefill_attention": 1,
                                                   "mla_attention": 1, "mla_prefill": 1, "sliding_attention": 1, "decoder": 2, "collective": 2, "program": 2}, 1)
    # a user program's bare Graph becomes a Workload with the dataclass's defaults, which these entries name
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "user_graph.py"
    w = workload_from_config({"workload": "program", "program": f"{example}:silu_rows"})
    assert (w.channel_depth, w.hardware) == (WORKLOAD_CHANNEL_DEPTH["program"], WORKLOAD_HARDWARE["program"])
    assert (PRESETS["step-eval"].channel_depth, PRESETS["step-hdl"].channel_depth) == (2, 1)
    assert UNBOUNDED_CHANNEL_DEPTH == 1024


@pytest.mark.parametrize("hardware_text, knob, depth, cycles", [
    (None, None, 1, 15276),                                   # the workload's depth: today's cycles
    ('preset = "step-hdl"\npmu_bw = 256\n', None, 1, 15276),  # a file that leaves channel_depth alone
    ('preset = "step-hdl"\nchannel_depth = 1\n', None, 1, 15276),
    ('preset = "step-hdl"\nchannel_depth = 64\n', None, 64, None),
    ('preset = "step-hdl"\nchannel_depth = 64\n', 1, 1, 15276),  # the knob outranks the hardware file
])
def test_a_hardware_files_channel_depth_reaches_the_run(tmp_path, hardware_text, knob, depth, cycles):
    config = {"workload": "swiglu", "tile_m": 32, "tile_n": 64, "mode": "simulate"}
    if hardware_text is not None:
        (tmp_path / "hw.toml").write_text(hardware_text)
        config["hardware"] = str(tmp_path / "hw.toml")
    if knob is not None:
        config["channel_depth"] = knob
    record = run_config(config)
    assert record.config["run_channel_depth"] == depth
    if cycles is not None:
        assert record.row["cycles"] == cycles
    else:
        deep = record.row["cycles"]
        assert deep != 15276
        # the same depth given as the knob gives the same run
        same = run_config({**{k: v for k, v in config.items() if k != "hardware"}, "channel_depth": 64})
        assert same.row["cycles"] == deep
    assert record.run_id == run_identity(config)[0]


def test_a_presets_own_depth_never_overrides_a_workloads_depth_but_an_explicit_one_does():
    from stepsim.workloads.config import workload_from_config

    attention = workload_from_config({"workload": "attention"})
    today = simulate(attention)
    assert today.channel_depth == 1  # step-eval's field says 2; the experiment ran 1-deep
    assert simulate(attention, Hardware.preset("step-eval")).cycles == today.cycles
    explicit = simulate(attention, Hardware.preset("step-eval", channel_depth=2))
    assert explicit.channel_depth == 2 and explicit.cycles != today.cycles
    assert simulate(attention, Hardware.preset("step-eval", channel_depth=2), channel_depth=1).cycles == today.cycles
    # a bare graph has no workload depth: the hardware's applies
    graph = build_swiglu(tile_m=32, tile_n=64).graph
    assert simulate(graph, "step-eval").channel_depth == 2
    assert simulate(graph, "step-hdl").channel_depth == 1
    assert simulate(graph, "step-eval", channel_depth=None).channel_depth == UNBOUNDED_CHANNEL_DEPTH


@pytest.mark.parametrize("text, message", [
    ('hbm_channels = "4"\n', "hardware 'step-eval': hbm_channels must be a positive int, got '4'"),
    ('preset = "step-hdl"\nchannel_depth = 0\n', "hardware 'step-hdl': channel_depth must be None or an int >= 1, got 0"),
    ("preset = 3\n", "unknown hardware preset 3; known presets: sn40l, step-eval, step-hdl"),
    ('explicit = ["pmu_bw"]\n', "unknown hardware key 'explicit'"),
])
def test_bad_hardware_files_name_the_file_and_the_key(tmp_path, text, message):
    from stepsim.base.errors import ConfigError

    path = tmp_path / "hw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        run_identity({"workload": "swiglu", "hardware": str(path)})
    assert str(info.value).startswith(f"{path}: {message}")
