"""See inside a run: deadlock diagnosis (:mod:`.deadlock`), the bottleneck report (:mod:`.report`) and run
comparison (:mod:`.compare`); the ``stepsim report`` / ``stepsim compare`` commands live in :mod:`.cli`."""
