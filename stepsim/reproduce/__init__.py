"""Reproduce the STeP paper's evaluation (docs/semantics.md §5.3-§5.6): ``stepsim reproduce EXPERIMENT``.

One module per purpose:

* :mod:`~stepsim.reproduce.layout` finds the traces (``expert_routing/``, ``kv_lengths/``) and the variance
  classes of the KV windows;
* :mod:`~stepsim.reproduce.execute` simulates an experiment's configurations (here, or on the sweep package's
  worker pool);
* :mod:`~stepsim.reproduce.dynamic_tiling` (§5.3), :mod:`~stepsim.reproduce.time_multiplexing` (§5.4),
  :mod:`~stepsim.reproduce.dynamic_parallelization` (§5.5), :mod:`~stepsim.reproduce.validation` (§5.6): each
  plans its points, builds its raw table, computes its headline numbers and prints a summary;
* :mod:`~stepsim.reproduce.figures` draws the paper-like PNGs; :mod:`~stepsim.reproduce.output` writes the
  tables (Parquet with provenance, CSV) and the headline JSON atomically;
* :mod:`~stepsim.reproduce.driver` ties them together; :mod:`~stepsim.cli.reproduce` is the command.
"""

import importlib

#: public names -> the module that defines them; imported on first use (PEP 562), so that ``stepsim reproduce``
#: can start its worker pool before the experiments' heavy dependencies load (stepsim.cli.reproduce)
_EXPORTS = {"CHOICES": "names", "EXPERIMENTS": "driver", "JSON_KEYS": "driver", "ExperimentResult": "driver",
            "reproduce": "driver", "RunFailedError": "errors", "TracesLayoutError": "errors"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
