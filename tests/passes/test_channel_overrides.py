"""Per-channel depth overrides in lowering (``lower(..., channel_depths=...)``) and the pass's argument checks."""

import pytest

from stepsim.base.errors import ArgumentError, LoweringError
from stepsim.graph import FP32, Flatten, Graph, LinearOffChipLoad, LinearOffChipStore, Map, Silu, Tensor
from stepsim.graph.channels import channel_infos, graph_fingerprint
from stepsim.graph.lower import lower
from stepsim.passes import size_fifos
from stepsim.simulation.simulate import simulate


def _graph():
    g = Graph("pair")
    x = Flatten(g, LinearOffChipLoad(g, Tensor("x", (64 * 16, 64), FP32), tile=(16, 64), out_shape_tiled=(64, 1),
                                     stride=(1, 0)), 0, 1)
    slow = Map(g, x, Silu(), compute_bw=64)
    LinearOffChipStore(g, slow)
    return g


def test_overrides_set_exactly_the_named_channels():
    g = _graph()
    program = lower(g, channel_depth=2, channel_depths={"Flatten_1[0]": 7})
    assert dict(zip(program.channel_names, program.ch_capacity.tolist())) == {
        "LinearOffChipLoad_0[0]": 2, "Flatten_1[0]": 7, "Map_2[0]": 2}
    assert [c.name for c in channel_infos(g)] == list(program.channel_names)
    assert [(c.elem_bytes, c.tokens) for c in channel_infos(g)] == [(4096, 64)] * 3
    # the slow Map backs the load up: the overridden FIFO fills to its depth, no further
    res = simulate(g, channel_depth=2, channel_depths={"Flatten_1[0]": 7})
    assert dict(zip(res.channel_names, res.channel_counters[:, 1].tolist()))["Flatten_1[0]"] == 7


@pytest.mark.parametrize("depths, message", [
    ({"Map_9[0]": 4}, "channel_depths: graph 'pair' has no channel 'Map_9[0]'"),
    ({"Map_9[0]": 4, "Map_8[0]": 4}, "channel_depths: graph 'pair' has no channel 'Map_8[0]' (and 1 more unknown "
                                     "names)"),
    ({"Map_2[0]": 0}, "channel_depths['Map_2[0]'] must be an int >= 1, got 0"),
    ({"Map_2[0]": 2.5}, "channel_depths['Map_2[0]'] must be an int >= 1, got 2.5"),
])
def test_bad_overrides_are_refused(depths, message):
    with pytest.raises(LoweringError) as err:
        lower(_graph(), channel_depths=depths)
    assert str(err.value) == message


def test_fingerprints_are_stable_across_builds_and_differ_between_graphs():
    assert graph_fingerprint(_graph()) == graph_fingerprint(_graph())
    other = Graph("pair")
    x = Flatten(other, LinearOffChipLoad(other, Tensor("x", (64 * 16, 64), FP32), tile=(16, 64),
                                         out_shape_tiled=(64, 1), stride=(1, 0)), 0, 1)
    LinearOffChipStore(other, Map(other, x, Silu(), compute_bw=128))
    assert graph_fingerprint(other) == graph_fingerprint(_graph())  # same channels and streams: same structure
    wider = Graph("pair")
    y = Flatten(wider, LinearOffChipLoad(wider, Tensor("x", (64 * 32, 64), FP32), tile=(32, 64),
                                         out_shape_tiled=(64, 1), stride=(1, 0)), 0, 1)
    LinearOffChipStore(wider, Map(wider, y, Silu(), compute_bw=64))
    assert graph_fingerprint(wider) != graph_fingerprint(_graph())


@pytest.mark.parametrize("kwargs, message", [
    ({"slack": 1.5}, "size_fifos: slack must be a number in [0, 1) (0.01 = 1 %), got 1.5"),
    ({"jobs": 0}, "size_fifos: jobs must be an int >= 1, got 0"),
    ({"min_depth": 0}, "size_fifos: min_depth must be an int in 1..1024, got 0"),
    ({"traces": ["a.npz"]}, "size_fifos: traces= applies to a config mapping (one workload is built per trace); a "
                            "Workload or Graph already carries its trace"),
])
def test_size_fifos_argument_errors(kwargs, message):
    with pytest.raises(ArgumentError) as err:
        size_fifos(_graph(), **kwargs)
    assert str(err.value) == message


def test_a_graph_is_sized_in_process():
    result = size_fifos(_graph())
    unbounded = simulate(_graph(), channel_depth=1024).cycles
    assert result.unbounded_cycles == unbounded
    assert simulate(_graph(), channel_depth=1024, channel_depths=result.depths).cycles == result.cycles
    assert result.cycles <= int(unbounded * 1.01)
    assert result.identity == {"workload": "graph", "params": {}} and result.trace_hashes == []
