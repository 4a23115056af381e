"""What the lessons run: one module per topic, called on the ranks of the warm pool
(spawned ranks can only run functions that live in the package) or, for
single-process measurements, in the notebook's own kernel.

Each function returns plain numbers, booleans and lists, so a notebook can
print the deterministic ones and only plot the timings. The equivalence
checks (a component against its single-process reference) are shared with
the tests, which assert on the same numbers the lessons print.
"""
