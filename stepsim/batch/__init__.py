"""Parameter sweeps: expand a sweep file into tasks, run them in parallel, resume, record failures.

``stepsim sweep SWEEP.toml`` (see :mod:`stepsim.cli.sweep`). The pieces, one purpose each:

* :mod:`~stepsim.batch.config` reads and checks the sweep file (format in its docstring);
* :mod:`~stepsim.batch.grid` expands it (lazily) into plain-dict tasks keyed by their record ``run_id`` (a hash
  of everything that determines the result, trace and hardware file contents included);
* :mod:`~stepsim.batch.tasks` is what a worker runs for one task (a failure becomes an outcome, not an
  exception);
* :mod:`~stepsim.batch.executors` / :mod:`~stepsim.batch.dask_executor` run tasks on warm local worker
  processes or on a Dask cluster;
* :mod:`~stepsim.batch.rows` turns outcomes into rows (ok or failed, one schema) and reads a folder back;
* :mod:`~stepsim.batch.store` batches rows into atomically written part files, indexes the finished tasks and
  replaces the rows of tasks whose trace or hardware file changed;
* :mod:`~stepsim.batch.runner` ties these together (resume, fail-fast, progress bar) and
  :mod:`~stepsim.batch.summary` prints the end-of-sweep table.

>>> from stepsim.batch import load_sweep, run_sweep, read_sweep      # doctest: +SKIP
>>> report = run_sweep(load_sweep("sweeps/swiglu.toml"), jobs=4)      # doctest: +SKIP
>>> read_sweep(report.out).to_pandas()                                # doctest: +SKIP
"""

from stepsim.batch.config import SweepSpec, load_sweep, parse_sweep
from stepsim.batch.grid import Task, expand
from stepsim.batch.rows import read_sweep
from stepsim.batch.runner import SweepReport, SweepStopped, run_sweep
