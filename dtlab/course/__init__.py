"""The course plane: what the lessons teach, and the checks that keep the course whole.

* :mod:`dtlab.course.index`: the lessons as data, which glossary
  words each one teaches, and the files linked but not built yet.
* :mod:`dtlab.course.glossary`: the bilingual glossary (``glossary/*.json``),
  lookup by any name, rendering; :mod:`dtlab.course.glossary_cli` is the
  ``dtlab glossary`` command.
* :mod:`dtlab.course.coverage`: checks that every lesson, label and README
  entry is in English and Chinese (``python -m dtlab.course.coverage``).
* :mod:`dtlab.course.experiments`: what the lessons run, one module per
  topic, on ranks of the warm pool or in the notebook's own process. The
  equivalence checks there are also what the tests run, so a lesson and its
  test measure the same thing.

The lesson notebooks are jupytext pairs in ``notebooks/``: ``NN_name.py``, the
source, and ``NN_name.ipynb``, stored executed by ``tools/execute_lessons.py``.
Nothing in the engine imports this package; the CLI and the lab do (flash
cards read the glossary, views replay experiments).
"""
