"""The demo: MoE static vs dynamic tiling on the bundled trace (:mod:`stepsim.demo.moe_tiling`)."""

def __getattr__(name: str):
    """The names of the module ``stepsim.demo`` of the last release, deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
