"""One run -> one record (:mod:`stepsim.results.records`)."""

def __getattr__(name: str):
    """The names of the module ``stepsim.results`` of the last release, deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
