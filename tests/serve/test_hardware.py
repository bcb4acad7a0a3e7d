"""Serving hardware fields: the SN40L preset's numbers, defaults that leave every run id alone, the on-chip
check's one line, and ``stepsim serve --hardware`` sizing the KV cache from the hardware's HBM."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from serve_requests import requests_file

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.base.hardware import ENGINE_FIELDS, PRESETS, RESOURCE_FIELDS, SERVING_DEFAULTS, SERVING_FIELDS, Hardware
from stepsim.serve.output import read_outputs

MODEL = "qwen3-30b-a3b"


def test_sn40l_preset_from_public_numbers():
    hw = PRESETS["sn40l"]
    assert hw.hbm_capacity_bytes == 68_719_476_736            # 64 GiB per socket
    assert hw.on_chip_capacity_bytes == 545_259_520            # 520 MiB = 1040 PMUs x 512 KiB
    assert hw.peak_flops_per_cycle * hw.clock_hz == 638 * 10**12  # 638 bf16 TFLOP/s
    assert hw.hbm_peak_bytes_per_cycle * hw.clock_hz == 1_600_000_000_000  # 1.6 TB/s (25.6 TB/s / 16)
    assert hw.seconds(1_500_000) == 0.0015


def test_existing_presets_keep_their_engine_values_and_identity():
    assert PRESETS["step-eval"].values() == {"addr_offset": 64, "hbm_channels": 32, "hbm_latency": 2,
                                             "hbm_init_interval": 2, "hbm_start_up": 14, "hbm_outstanding": 1,
                                             "pmu_bw": 64, "channel_depth": 2}
    assert PRESETS["step-hdl"].values()["hbm_channels"] == 8 and PRESETS["step-hdl"].values()["pmu_bw"] == 256
    assert set(ENGINE_FIELDS) | set(SERVING_FIELDS) | set(RESOURCE_FIELDS) == {
        f.name for f in dataclasses.fields(Hardware)} - {"name", "explicit"}
    for field in SERVING_FIELDS + RESOURCE_FIELDS:  # a serving or resource field joins the identity only when it differs from its default
        assert getattr(PRESETS["step-eval"], field) == SERVING_DEFAULTS[field]
        hw = Hardware.preset("step-eval", **{field: 2 * SERVING_DEFAULTS[field]})
        assert hw.values()[field] == 2 * SERVING_DEFAULTS[field]
        assert hw.name == f"step-eval+{field}={2 * SERVING_DEFAULTS[field]}"


def test_serving_fields_are_checked_and_read_from_toml(tmp_path):
    with pytest.raises(ConfigError) as e:
        Hardware.preset("sn40l", clock_hz=0)
    assert str(e.value) == "hardware 'sn40l': clock_hz must be a positive int, got 0"
    path = tmp_path / "hw.toml"
    path.write_text('preset = "sn40l"\nhbm_capacity_bytes = 80000000000\n')
    hw = Hardware.from_toml(path)
    assert (hw.name, hw.hbm_capacity_bytes, hw.clock_hz) == ("sn40l+hbm_capacity_bytes=80000000000",
                                                             80_000_000_000, 1_000_000_000)
    assert Hardware.from_dict(hw.to_dict()) == hw


def test_on_chip_check_says_by_how_much():
    hw = PRESETS["sn40l"]
    hw.check_on_chip(545_259_520, "layer")  # exactly full fits
    with pytest.raises(ConfigError) as e:
        hw.check_on_chip(600_000_000, "decode layer 'attention' (batch 64)")
    assert str(e.value) == ("decode layer 'attention' (batch 64) needs 600,000,000 bytes on chip; hardware 'sn40l' "
                            "has 545,259,520 (54,740,480 bytes short)")


def test_serve_hardware_sizes_the_kv_cache(tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 1.0], 100, 10)
    default = stepsim.serve(MODEL, trace, iteration_latency=0.01)
    assert default.summary["hardware"]["name"] == "sn40l"
    assert default.summary["kv_cache"]["hbm_bytes"] == 68_719_476_736
    path = tmp_path / "hw.toml"
    path.write_text('preset = "sn40l"\nhbm_capacity_bytes = 62000000000\n')
    r = stepsim.serve(MODEL, trace, iteration_latency=0.01, hardware=str(path), out=tmp_path / "o")
    assert r.summary["kv_cache"]["num_blocks"] == (62_000_000_000 - 61_064_220_672) // (16 * 98_304) == 594
    assert r.summary["hardware"] == {"name": "sn40l+hbm_capacity_bytes=62000000000", "clock_hz": 1_000_000_000,
                                     "hbm_capacity_bytes": 62_000_000_000, "on_chip_capacity_bytes": 545_259_520,
                                     "peak_flops_per_cycle": 638_000}
    assert read_outputs(tmp_path / "o")[2]["hardware"] == r.summary["hardware"]
    assert np.array_equal(r.requests["finish_s"].to_numpy(), default.requests["finish_s"].to_numpy())
    small = tmp_path / "small.toml"
    small.write_text('preset = "sn40l"\nhbm_capacity_bytes = 60000000000\n')
    with pytest.raises(ConfigError) as e:
        stepsim.serve(MODEL, trace, iteration_latency=0.01, hardware=str(small))
    assert str(e.value) == "the model's weights (61.06 GB) do not fit in HBM (60.00 GB): 1.06 GB short; serve it on " \
                                 "several chips with --system FILE"


def test_resource_fields_give_the_units_a_mapping_spreads_over():
    hw = PRESETS["sn40l"]
    assert (hw.compute_units, hw.memory_units) == (1040, 1040)  # "1040 PCUs and PMUs" (docs/hardware.md)
    assert hw.unit_flops_per_cycle == 613  # 638,000 // 1,040
    assert hw.memory_unit_bytes == 512 * 2**10  # 520 MiB over 1,040 PMUs
    with pytest.raises(ConfigError) as e:
        Hardware.preset("sn40l", compute_units=0)
    assert str(e.value) == "hardware 'sn40l': compute_units must be a positive int, got 0"
