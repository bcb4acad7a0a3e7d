"""The experiments' names, importable without their dependencies (the command's help and argument checks
need them before anything heavy is imported; :mod:`stepsim.reproduce.driver` checks they match its modules)."""

#: the experiments, in the paper's order (each module's ``NAME``)
EXPERIMENT_NAMES = ("dynamic-tiling", "time-multiplexing", "dynamic-parallelization", "validation")
ALL = "all"
CHOICES = (*EXPERIMENT_NAMES, ALL)
