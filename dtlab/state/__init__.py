"""State: what a rank holds between steps, and the training checkpoints made of it.

* :mod:`dtlab.state.training_state`: the pieces of a rank's state, each saying where it belongs;
* :mod:`dtlab.state.checkpoint`: written atomically, verified when read, resharded onto another layout.
"""
