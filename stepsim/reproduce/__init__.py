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
* :mod:`~stepsim.reproduce.driver` ties them together; :mod:`~stepsim.reproduce.cli` is the command.
"""

from stepsim.reproduce.driver import CHOICES, EXPERIMENTS, JSON_KEYS, ExperimentResult, reproduce
from stepsim.reproduce.errors import RunFailedError, TracesLayoutError
