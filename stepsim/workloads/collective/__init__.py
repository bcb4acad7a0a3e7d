"""Collectives over many chips as STeP graphs over link units (all-reduce, reduce-scatter, all-gather, all-to-all).

``build.py`` builds them over a :class:`~stepsim.base.system.System`, ``closed_form.py`` gives the cycles the
engine must reproduce on an idle system.
"""
