"""The learner does the thinking: predictions with an answer key, code exercises graded on real ranks.

How a lesson uses it (the framework, for lesson authors)
--------------------------------------------------------
**A prediction.** List it in this package's ``lessonNN.py`` (``PREDICTIONS``)::

    Prediction("03.stage1_bytes", 3, "bytes per rank at stage 1", "stage 1 每个 rank 的字节数",
               answer=2 * PSI + 2 * PSI + 12 * PSI // 4, rel_tol=0.0,
               hint_en="bytes, an integer", hint_zh="字节数（整数）",
               mistakes=(Mistake(16 * PSI, "that is stage 0: ...", "那是 stage 0：……"),))

The answer is worked out from the course's facts, never read from a
measurement (so filling it in tests the lesson). In the lesson, the cell
starts empty and the check names the key::

    my_prediction = None   # bytes per rank, an integer / 每个 rank 的字节数（整数）
    ...
    check("03.stage1_bytes", my_prediction, measured)

``dtlab.lab.check`` then prints, in both languages, "no prediction yet: write
yours and re-run" (and the measurement), or ✓/✗ with the stated tolerance
and, for a wrong one, the matching mistake's explanation or the gap. A
number can also be typed into ``prediction_box("03.stage1_bytes")``
(:mod:`dtlab.lab.prediction_box`). With ``DTLAB_FILL_PREDICTIONS=1`` an empty
prediction is filled from the answer key (the test that runs every lesson
that way asserts every check is right). A ``check`` whose name the answer
key does not list behaves as before (no tolerance text, no progress).

**An exercise.** The learner writes the heart of a component in a cell; the
stored notebook holds a stub whose body is ``raise NotImplementedError``::

    def ring_step(chunks, step, rank, size):
        raise NotImplementedError      # your code here / 在这里写你的代码

    grade("01.ring_step", ring_step)

List it in ``EXERCISES`` as an :class:`Exercise`: the learner's function name,
a rank-side ``check(ctx, source, name) -> dict`` (module level, so spawned
ranks find it; it compiles the source with
:func:`~dtlab.course.exercises.ranks.learner_function`, runs it against
dtlab's own component and returns :func:`~dtlab.course.exercises.ranks.verdict`
naming the rank, the element, expected and got), a ``reference`` solution
(self-contained: its source is shipped the same way) and the world size.
``grade`` prints the verdict in both languages and records it; ``solution(key)``
prints the reference in instructor mode (``DTLAB_SOLUTIONS=1`` or ``dtlab lab
--solutions``), where grading a stub grades the reference instead. Tests
(``tests/test_exercises.py``) run, per exercise, the reference, at least two
planted wrong solutions (``tests/exercise_answers.py``) and the stub.

**Progress** (:mod:`~dtlab.course.exercises.progress`) is a local file, never
the notebook: ``dtlab progress`` prints it per lesson, and lesson 17 shows it
(:func:`show_progress`).

Modules: ``model`` (the data), ``registry`` (every lesson's entries by key),
``predictions`` (judging a prediction), ``ranks`` (the rank side of grading),
``grader`` (the caller side), ``progress`` (the file), ``report`` (per-lesson
counts, ``dtlab progress``), ``lessonNN`` (each lesson's answer key and exercises).
"""

from dtlab.course.exercises.grader import grade, solution, solutions_shown
from dtlab.course.exercises.model import MEASURED, Exercise, Mistake, Prediction
from dtlab.course.exercises.predictions import judge
from dtlab.course.exercises.report import show_progress

__all__ = [
    "Exercise",
    "MEASURED",
    "Mistake",
    "Prediction",
    "grade",
    "judge",
    "show_progress",
    "solution",
    "solutions_shown",
]
