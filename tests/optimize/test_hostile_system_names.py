"""Free text never becomes a path or broken TOML: a system's ``name`` (a key of the user's system file) with
``../``, quotes, backslashes, newlines or nothing at all is written by ``stepsim optimize --max-chips`` as one file
inside ``OUT/systems/`` (stepsim.base.files.safe_stem), in TOML that reads back as the same name
(stepsim.base.files.toml_string), and a user's file beside ``--out`` is never touched.
"""

from __future__ import annotations

import tomllib

import pytest
from small_routing import write_small_routing

from stepsim.base.files import MAX_STEM, safe_stem, toml_string
from stepsim.base.system import System
from stepsim.optimize import optimize
from stepsim.optimize.chips import system_file

#: (name, the file name it becomes in OUT/systems/ at 2 chips)
HOSTILE = [
    ("ring", "ring-2.toml"),
    ("../../victim", "victim-2-a598b49a.toml"),
    ("../victim", "victim-2-2d616a0c.toml"),
    ('a"b', "a_b-2-b7064853.toml"),
    ("a\\b", "a_b-2-c57881e1.toml"),
    ('x"\nchips = 99\n#', "x__chips___99__-2-6c835f43.toml"),
    ("", "2-cf3bae39.toml"),
    ("..", "2-9e530b60.toml"),
    (".hidden", "hidden-2-5f7abf94.toml"),
    ("/etc/passwd", "etc_passwd-2-09091d8c.toml"),
    ("sp ace\ttab\x7f", "sp_ace_tab_-2-f519e609.toml"),
    ("é", "2-bdc15203.toml"),
    ("n" * 300, "n" * MAX_STEM + "-717be93c.toml"),
]


@pytest.mark.parametrize("name, file_name", HOSTILE, ids=[repr(n[:20]) for n, _ in HOSTILE])
def test_a_system_name_becomes_one_file_in_out_systems(tmp_path, name, file_name):
    out = tmp_path / "out"
    victim = tmp_path / "victim-2.toml"
    victim.write_text("the user's file\n")
    system = System.preset("ring-4")
    system = type(system)(name, *(getattr(system, f) for f in ("chips", "hardware", "dimensions", "links",
                                                                "n_switches", "hardware_spec")))
    path = system_file(system, 2, out)
    assert path == (out / "systems" / file_name).resolve().as_posix()
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["out", "systems", file_name, "victim-2.toml"])
    assert victim.read_text() == "the user's file\n"
    data = tomllib.loads((out / "systems" / file_name).read_text())
    assert data == {"name": f"{name}-2", "chips": 2, "hardware": "step-eval", "topology": "ring",
                    "link_bandwidth": 64, "link_latency": 500}
    assert System.load(path).name == f"{name}-2"


@pytest.mark.parametrize("text", ['a"b', "a\\b", "x\ny", "\x00\x1f\x7f", "é", "'", '"""', "\\u0041"])
def test_toml_string_reads_back_as_the_same_text(text):
    assert tomllib.loads(f"k = {toml_string(text)}\n") == {"k": text}


def test_two_names_that_clean_alike_get_two_files():
    assert safe_stem("a/b") != safe_stem("a_b") and safe_stem("a/b") != safe_stem("a\\b")


def test_optimize_keeps_a_hostile_system_name_inside_out(tmp_path, serial):
    """The whole command: a system file named ``../../victim`` scaled to 2 chips writes OUT/systems/victim-2-*.toml;
    the user's ``victim-2.toml`` two folders above OUT is untouched and the candidate runs on the written file."""
    trace = write_small_routing(tmp_path)[0]
    victim = tmp_path / "victim-2.toml"
    victim.write_text("the user's file\n")
    hostile = tmp_path / "hostile.toml"
    hostile.write_text('name = "../../victim"\nchips = 4\ntopology = "ring"\nlink_bandwidth = 64\n'
                       'link_latency = 500\n')
    out = tmp_path / "a" / "opt"
    space = [{"tiling": ("dynamic",), "tile_f": (64,)},
             {"tiling": ("dynamic",), "tile_f": (64,), "ep": (2,), "placement": ("round-robin",)}]
    r = optimize("moe", out=out, executor=serial, max_chips=2, space=space, system=str(hostile), trace=trace,
                 model="custom", hidden=512, intermediate=512, experts=8, top_k=2)
    written = (out / "systems" / "victim-2-a598b49a.toml").resolve().as_posix()
    assert [(c.chips, c.config.get("system"), c.status) for c in r.candidate_list] == [
        (1, None, "simulated"), (2, written, "simulated")]
    assert victim.read_text() == "the user's file\n"
    assert sorted(p.name for p in (out / "systems").iterdir()) == ["victim-2-a598b49a.toml"]
    assert System.load(written).name == "../../victim-2"
