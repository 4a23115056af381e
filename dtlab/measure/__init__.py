"""Measurement inside a rank: the memory accountant and step timers, and the Chrome trace of a run.

* :mod:`dtlab.measure.memory`: bytes per rank by category, and what times a step's compute and waits;
* :mod:`dtlab.measure.allocator`: those categories checked against the device's allocator (``make gpu-check``);
* :mod:`dtlab.measure.chrome_trace`: step records turned into a trace for Perfetto or chrome://tracing.
"""
