"""The expert-parallel chips' fast FFN estimate (stepsim/serve/fast_mapped_ep.py): the larger of two lines through
the bucket's simulated top and bottom, one in tokens and one in load; and the loads left out of the fit."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.serve.fast import calibrate
from stepsim.serve.fast_mapped_ep import EP_COLUMNS, MappedEPFastLatency, Point, Reference, ep_estimate

#: a bucket of 128 tokens: its bottom (65 tokens) at load 0.75 took 4,000 cycles, its top at load 1 took 6,000
REF = Reference(Point(65, 0.75, 4000.0), Point(128, 1.0, 6000.0), 13.0, 6.0, {"tile_n": 16, "regions": 8})


def test_the_estimate_is_the_larger_of_the_lines_in_tokens_and_in_load():
    # 91 tokens: the tokens line gives 4000 + 2000 * 26 / 63 (4,825.4); the load line 4000 + 2000 * (load - 0.75)
    # / 0.25: 2,000 at 0.5, 5,200 at 0.9, 7,600 at 1.2
    got = ep_estimate(91, np.array([0.5, 0.9, 1.2]), REF)
    assert got.tolist() == [4000 + 2000 * 26 / 63, 5200.0, 7600.0]


def test_the_lines_stop_at_zero_and_a_one_point_bucket_goes_through_the_origin():
    assert ep_estimate(1, np.array([0.0]), REF).tolist() == [4000 + 2000 * -64 / 63]  # the load line below 0
    steep = Reference(Point(65, 0.75, 500.0), Point(128, 1.0, 6000.0), 13.0, 6.0, REF.knobs)
    assert ep_estimate(1, np.array([0.0]), steep).tolist() == [0.0]  # both lines below 0
    one = Reference(Point(1, 1.0, 1600.0), Point(1, 1.0, 1600.0), 1.5, 1.5, {"tile_n": 1, "regions": 2})
    assert ep_estimate(1, np.array([0.5, 2.0]), one).tolist() == [1600.0, 3200.0]


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
