"""The docstring written under each field of a dataclass, read from its source.

Python keeps no docstring for a class attribute: the string literal under
``dp: int = 1`` is an expression statement the compiler drops. Documentation
tools that show such docstrings (Sphinx's autodoc, for one) read the class's
source with ``ast``, and so does this module, once per class. That lets
``dtlab train --help`` describe an option with the very sentence a reader sees
in ``dtlab/config/train_config.py``.

The source is found through the class's module file (``inspect.getsource``),
which an installed package ships beside its bytecode; where there is no
source to read (a bytecode-only build), every docstring is empty rather than
an error.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` for ``cls``, including fields its base classes document."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # base classes first, so a subclass overrides them
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(klass: type) -> dict[str, str]:
    """The docstrings under the annotated assignments in ``klass``'s own body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):  # no source shipped, or a class built at run time
        return {}
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), [])
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs
