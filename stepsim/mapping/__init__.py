"""Whole-chip mapping: a serving layer spread over the chip's units, as a dataflow compiler spreads it (docs/mapping.md).

The paper's evaluation schedules compare tilings on a small chip: a few compute units at a fixed ``compute_bw``,
one weight load per expert matrix (at most 64 B/cycle each), fixed tiles. On a chip of 1,040 compute and memory
units they leave most of it idle: a Llama-3.1-8B FFN reads its weights at 190 B/cycle of the 1,600 the HBM serves.
The mapper chooses, for a layer kind and shape on a hardware, the schedule (tile sizes, lanes per expert, regions of
the decode attention, FIFO depths, and ``compute_bw`` of every compute operator from the compute units it gets) that
minimises cycles within the chip's compute units, memory units and on-chip capacity:

* :mod:`~stepsim.mapping.schedule`: :class:`Schedule` (the knobs, its cycles and the units it uses), read and written
  as JSON (``--schedule FILE``);
* :mod:`~stepsim.mapping.units`: what a built graph needs of the chip, and the compute units given to each compute
  operator in proportion to its FLOPs;
* :mod:`~stepsim.mapping.kinds`: each mapped kind's search space, representative data and builder;
* :mod:`~stepsim.mapping.mapper`: the search (bounds prune, the engine decides) and its cache;
* :mod:`~stepsim.mapping.unmappable`: the layers no schedule fits, remembered in the process (``schedule_for``).
"""

from stepsim.mapping.mapper import map_layer, mapped_workload
from stepsim.mapping.schedule import Schedule
from stepsim.mapping.unmappable import schedule_for

__all__ = ["Schedule", "map_layer", "mapped_workload", "schedule_for"]
