"""stepsim.base.lazy_import.LazyModule: imported on first attribute read, transparent afterwards."""

import sys
import types

from stepsim.base.lazy_import import LazyModule


def test_imported_on_first_read_then_replaced_in_stepsim_globals(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_probe_module", raising=False)
    proxy = LazyModule("lazy_probe_module")
    holder = types.ModuleType("stepsim._lazy_probe_holder")  # a stepsim module holding the stand-in
    other = types.ModuleType("elsewhere")  # a module outside stepsim: left alone
    holder.mod = other.mod = proxy
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    monkeypatch.setitem(sys.modules, other.__name__, other)

    assert "lazy_probe_module" not in sys.modules  # nothing imported by creating the stand-in
    assert proxy.VALUE == 42
    real = sys.modules["lazy_probe_module"]
    assert holder.mod is real and other.mod is proxy
    monkeypatch.setattr(real, "VALUE", 7)
    assert proxy.VALUE == 7  # reads go to the module itself, so a monkeypatch is seen
    assert repr(proxy) == "<lazily imported module 'lazy_probe_module'>"
