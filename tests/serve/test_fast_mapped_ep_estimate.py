"""The expert-parallel chips' fast FFN estimate (stepsim/serve/fast_mapped_ep.py, by
stepsim.serve.fast_mapped.bucket_estimate): the larger of the bucket's line in tokens through its simulated top and
bottom and its top scaled by load; and the loads left out of the fit."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.serve.fast import calibrate
from stepsim.serve.fast_mapped_ep import EP_COLUMNS, MappedEPFastLatency, Point, Reference, ep_estimate

#: a bucket of 128 tokens: its bottom (65 tokens) took 4,000 cycles, its top at load 1.25 took 6,000
REF = Reference(Point(65, 0.75, 4000.0), Point(128, 1.25, 6000.0), 13.0, 6.0, {"tile_n": 16, "regions": 8})


def test_the_larger_of_the_line_in_tokens_and_the_top_scaled_by_load():
    # 91 tokens: the line gives 4000 + 2000 * 26 / 63 (4,825.4); the top scaled by load 6000 * load / 1.25
    line = 4000 + 2000 * (91.0 - 65) / (128 - 65)
    got = ep_estimate(91, np.array([0.5, 1.0, 1.5]), REF)
    assert got.tolist() == [line, line, 6000 * 1.5 / 1.25]  # 6000 * 1.0 / 1.25 = 4,800: below the line
    assert ep_estimate(128, np.array([1.25]), REF).tolist() == [6000.0]  # the top itself


def test_the_line_stops_at_zero_and_a_one_point_bucket_goes_through_the_origin():
    steep = Reference(Point(65, 0.75, 500.0), Point(128, 1.0, 6000.0), 13.0, 6.0, REF.knobs)
    assert ep_estimate(1, np.array([0.0]), steep).tolist() == [0.0]  # 500 - 5500 * 64 / 63 < 0, load 0
    one = Reference(Point(2, 1.0, 1600.0), Point(2, 1.0, 1600.0), 1.5, 1.5, {"tile_n": 1, "regions": 2})
    assert ep_estimate(1, np.array([0.25, 2.0]), one).tolist() == [800.0, 3200.0]


class _Exact(MappedEPFastLatency):
    """What calibrate() asks of a provider: the EP provider's fitted columns, pieces priced by a known rule."""

    def __init__(self, rows):  # no model, no engine
        self.rows = rows

    def run_tasks(self, tasks):
        return [(int(self.rows[data] @ np.arange(1, EP_COLUMNS + 1)),) for _, data in tasks]

    def piece_regressors(self, kind, data):
        return self.rows[data]


def test_the_loads_get_no_coefficient():
    rng = np.random.default_rng(0)
    rows = rng.uniform(1, 100, size=(60, EP_COLUMNS))
    samples = [(i, "decode", None, [("ffn", i)]) for i in range(60)]
    theta, _ = calibrate(_Exact(rows), samples, seed=0, hold_out=False)
    assert theta["ffn"][2:7] == [0.0] * 5
    assert all(v != 0.0 for j, v in enumerate(theta["ffn"]) if not 2 <= j < 7)


@pytest.mark.parametrize("model", ["decode", "prefill"])
def test_the_attention_keeps_every_column(model):
    assert _Exact(None).fitted_columns(model, 9).tolist() == [True] * 9
