"""The glossary lives in :mod:`dtlab.course.glossary`; this name is kept so that
``import dtlab.glossary`` (in notebooks and scripts written before the move)
still works. It is the same module object, not a copy.
"""
import sys

from dtlab.course import glossary as _glossary

sys.modules[__name__] = _glossary
