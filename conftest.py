"""For every pytest run here (tests and notebooks under nbval): the learner's progress file goes to a
temporary folder, never to the developer's own (``DTLAB_HOME``, see dtlab/course/exercises/progress.py),
and the lessons run in student form (no answer key filled in, no solutions shown)."""

import os
import tempfile

os.environ["DTLAB_HOME"] = tempfile.mkdtemp(prefix="dtlab-home-")
os.environ.pop("DTLAB_SOLUTIONS", None)
os.environ.pop("DTLAB_PROFILE", None)  # the machine profile lives in DTLAB_HOME too (dtlab/planner/profile.py)
os.environ.pop("DTLAB_FILL_PREDICTIONS", None)
