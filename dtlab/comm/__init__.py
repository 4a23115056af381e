"""The communication plane: every message a rank sends, and the algorithms made of them.

* :mod:`dtlab.comm.calls`: the one door to the network, torch.distributed's calls, each reported to
  the rank's tracer and bounded by a timeout (``from dtlab.comm import calls as comm``);
* :mod:`dtlab.comm.tracer`: what each rank sent or waited for, and when;
* :mod:`dtlab.comm.collectives`, :mod:`~dtlab.comm.ring_schedule`, :mod:`~dtlab.comm.ring_pipeline`:
  the ring all-reduce (a reduce-scatter, then an all-gather) from point-to-point messages;
* :mod:`dtlab.comm.point_to_point`: a send and its receive posted together, ranks within a group;
* :mod:`dtlab.comm.meter`: ``CommMeter``, the calls and bytes of one rank's collectives;
* :mod:`dtlab.comm.recursive_doubling`: the small-message all-reduce in log2(N) exchanges;
* :mod:`dtlab.comm.all_to_all`: every rank sends a different piece to every other (expert parallelism);
* :mod:`dtlab.comm.ring_backend`: ``--collectives ring|dtlab``, the training path on those algorithms;
* :mod:`dtlab.comm.shared_memory`, :mod:`~dtlab.comm.shared_memory_setup`,
  :mod:`~dtlab.comm.shared_memory_flights`: the ring's transport between ranks of one machine;
* :mod:`dtlab.comm.stragglers`: a slow rank, injected on purpose.
"""
