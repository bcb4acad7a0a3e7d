"""System files: the links each topology creates, the routes, presets, and one exact error line per bad file."""

from __future__ import annotations

import pytest

from stepsim.base.errors import ConfigError, SystemConfigError
from stepsim.base.system import System, from_toml


def _write(tmp_path, text, name="sys.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_ring_of_four_has_eight_directed_links_and_routes_the_short_way():
    s = System.preset("ring-4")
    assert s.chips == 4 and s.hardware.name == "step-eval"
    assert [link.name for link in s.links] == [
        "chip0->chip1", "chip1->chip2", "chip2->chip3", "chip3->chip0",
        "chip1->chip0", "chip2->chip1", "chip3->chip2", "chip0->chip3"]
    assert {(link.bandwidth, link.latency) for link in s.links} == {(64, 500)}
    assert s.route(0, 1) == (0,)
    assert s.route(0, 3) == (7,)          # one hop backwards, not three forwards
    assert s.route(0, 2) == (0, 1)        # a tie: the first-created link wins
    assert s.route(2, 2) == ()


def test_ring_of_two_has_one_link_each_way():
    s = System.load("ring-2")
    assert [link.name for link in s.links] == ["chip0->chip1", "chip1->chip0"]


def test_switch_routes_cross_the_switch_in_two_links(tmp_path):
    s = from_toml(_write(tmp_path, 'chips = 3\ntopology = "switch"\nlink_bandwidth = 32\nlink_latency = 7\n'))
    assert [link.name for link in s.links] == ["chip0->switch0", "switch0->chip0", "chip1->switch0",
                                               "switch0->chip1", "chip2->switch0", "switch0->chip2"]
    assert s.n_switches == 1
    assert s.route(0, 2) == (0, 5)
    assert s.route(2, 1) == (4, 3)


def test_fully_connected_routes_are_one_link():
    s = System.preset("fully-connected-8")
    assert len(s.links) == 56
    assert all(len(s.route(a, b)) == 1 for a in range(8) for b in range(8) if a != b)


def test_two_dimensions_multiply_and_route_dimension_by_dimension(tmp_path):
    text = """chips = 6
hardware = "step-hdl"
[[dimension]]
size = 2
topology = "fully-connected"
link_bandwidth = 100
link_latency = 10
[[dimension]]
size = 3
topology = "ring"
link_bandwidth = 50
link_latency = 20
"""
    s = from_toml(_write(tmp_path, text))
    assert s.chips == 6 and s.hardware.name == "step-hdl" and s.hardware_spec == "step-hdl"
    # dimension 0 groups (0,1) (2,3) (4,5): 6 links; dimension 1 groups (0,2,4) (1,3,5): 12 links
    assert len(s.links) == 18
    assert s.links[0].name == "chip0->chip1" and (s.links[0].bandwidth, s.links[0].latency) == (100, 10)
    assert s.links[6].name == "chip0->chip2" and (s.links[6].bandwidth, s.links[6].latency) == (50, 20)
    assert [s.links[k].name for k in s.route(0, 3)] == ["chip0->chip1", "chip1->chip3"]


def test_custom_links_and_a_hardware_file_relative_to_the_system_file(tmp_path):
    _write(tmp_path, "preset = \"step-eval\"\nhbm_channels = 8\n", name="hw.toml")
    text = """chips = 3
hardware = "hw.toml"
topology = "custom"
link_bandwidth = 16
link_latency = 3
[[link]]
src = 0
dst = 1
[[link]]
src = 1
dst = 2
bandwidth = 8
bidirectional = false
[[link]]
src = 2
dst = 0
latency = 9
bidirectional = false
"""
    s = from_toml(_write(tmp_path, text))
    assert s.hardware.hbm_channels == 8 and s.hardware_spec == str((tmp_path / "hw.toml").resolve())
    assert [(link.name, link.bandwidth, link.latency) for link in s.links] == [
        ("chip0->chip1", 16, 3), ("chip1->chip0", 16, 3), ("chip1->chip2", 8, 3), ("chip2->chip0", 16, 9)]
    assert s.route(0, 2) == (0, 2)


BAD = [
    ('chips = 4\ntopology = "ring"\nlink_bandwidth = 0\nlink_latency = 5\n',
     "{p}: link_bandwidth must be an int in 1..2147483647 (bytes/cycle), got 0"),
    ('chips = 4\ntopology = "ring"\nlink_bandwidth = 8\nlink_latency = 0\n',
     "{p}: link_latency must be an int in 2..2147483647 (cycles), got 0"),
    ('chips = 4\ntopology = "ring"\nlink_bandwidth = 8\nlink_latency = 1\n',
     "{p}: link_latency must be an int in 2..2147483647 (cycles), got 1"),
    ('chips = 4\ntopology = "mesh"\nlink_bandwidth = 8\nlink_latency = 2\n',
     "{p}: topology must be one of 'ring', 'fully-connected', 'switch', 'custom', got 'mesh'"),
    ('chips = 3\ntopology = "custom"\nlink_bandwidth = 8\nlink_latency = 2\n[[link]]\nsrc = 0\ndst = 5\n',
     "{p} link 0: dst = 5 names no chip (chips are 0..2)"),
    ('chips = 3\ntopology = "custom"\nlink_bandwidth = 8\nlink_latency = 2\n[[link]]\nsrc = 0\ndst = 1\n',
     "{p}: chip 2 is unreachable from chip 0 over the links"),
    ('chips = 2\ntopology = "custom"\nlink_bandwidth = 8\nlink_latency = 2\n'
     '[[link]]\nsrc = 0\ndst = 1\nbidirectional = false\n',
     "{p}: chip 0 is unreachable from chip 1 over the links"),
    ('chips = 2\ntopology = "custom"\nlink_bandwidth = 8\nlink_latency = 2\n[[link]]\nsrc = 1\ndst = 1\n',
     "{p} link 0: links chip 1 to itself"),
    ('chips = 5\n[[dimension]]\nsize = 2\ntopology = "ring"\nlink_bandwidth = 1\nlink_latency = 2\n',
     "{p}: chips = 5 but the dimensions' sizes multiply to 2"),
    ('chips = 2\ntopology = "ring"\nlink_bandwidth = 1\nlink_latency = 2\nlanes = 4\n',
     "{p}: unknown system key 'lanes'; known keys: chips, dimension, hardware, link, link_bandwidth, "
     "link_latency, name, topology"),
    ('chips = 2\ntopology = "ring"\nlink_latency = 2\n', "{p}: missing key 'link_bandwidth'"),
    ('chips = 2\nhardware = "tpu"\ntopology = "ring"\nlink_bandwidth = 1\nlink_latency = 2\n',
     "{p}: hardware 'tpu' is neither a preset (sn40l, step-eval, step-hdl) nor a .toml file"),
    ('chips = 2\ntopology = "ring"\nlink_bandwidth = 1.5\nlink_latency = 2\n',
     "{p}: link_bandwidth must be an int in 1..2147483647 (bytes/cycle), got 1.5"),
    ('chips = 0\ntopology = "ring"\nlink_bandwidth = 1\nlink_latency = 2\n',
     "{p}: chips must be an int in 1..2147483647 (chips), got 0"),
    ('chips = 3 3\n', None),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_system_file_is_one_typed_line(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(SystemConfigError) as info:
        from_toml(path)
    line = str(info.value)
    assert "\n" not in line
    if message is None:
        assert line.startswith(f"cannot read system file {path}: ")
    else:
        assert line == message.format(p=path)
    assert isinstance(info.value, ConfigError)


def test_unknown_preset_names_the_presets():
    with pytest.raises(SystemConfigError) as info:
        System.preset("ring-3")
    assert str(info.value) == ("unknown system preset 'ring-3'; known presets: fully-connected-8, ring-2, ring-4, "
                               "ring-8, sn40l-16, sn40l-8, switch-8, torus-4x4")
