"""Spec §8.2: all 15 points of the SwiGLU HDL-validation tile sweep, exactly."""

import json

import pytest

from stepsim.cli import main
from stepsim.workloads.swiglu.build import build_swiglu

TABLE = [  # tm, tn, off-chip bytes, on-chip bytes
    (16, 16, 8_454_144, 100_352), (16, 32, 7_405_568, 151_552), (16, 64, 6_881_280, 253_952),
    (16, 128, 6_619_136, 458_752), (16, 256, 6_488_064, 868_352), (32, 16, 5_308_416, 151_552),
    (32, 32, 4_259_840, 204_800), (32, 64, 3_735_552, 311_296), (32, 128, 3_473_408, 524_288),
    (32, 256, 3_342_336, 950_272), (64, 16, 3_735_552, 253_952), (64, 32, 2_686_976, 311_296),
    (64, 64, 2_162_688, 425_984), (64, 128, 1_900_544, 655_360), (64, 256, 1_769_472, 1_114_112),
]


@pytest.mark.parametrize("tm,tn,off,on", TABLE)
def test_swiglu_tile_sweep_point_matches_the_spec(tm, tn, off, on):
    m = build_swiglu(tile_m=tm, tile_n=tn).metrics()
    assert (m["off_chip_bytes"], m["on_chip_bytes"], m["flops"]) == (off, on, 117_473_280)
    # closed forms of the spec (B=64, D=256, F=512, 4 B/elem)
    b, d, f = 64, 256, 512
    assert off == 4 * (b * d * f // tn + 3 * (b // tm) * d * f + b * d)
    assert on == 4 * (3 * tm * d + 3 * d * tn + 2 * tm * tn)


def test_swiglu_weight_stream_shapes_at_16x16():
    g = build_swiglu(tile_m=16, tile_n=16).graph
    loads = {op.tensor.name: op.stream.shape for op in g if op.kind == "LinearOffChipLoad"}
    assert loads == {"x": (1, 4, 32, 1), "w_gate": (1, 4, 32, 1), "w_up": (1, 4, 32, 1), "w_down": (1, 4, 1, 32)}


def test_swiglu_metrics_cli_json(capsys):
    assert main(["metrics", "swiglu", "--tile-m", "64", "--tile-n", "128", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["off_chip_bytes"], row["on_chip_bytes"], row["flops"]) == (1_900_544, 655_360, 117_473_280)
