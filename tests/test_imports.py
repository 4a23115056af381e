"""The shape of the package: a package per plane, no import cycles, the engine never imports the lab or
the course, nothing too long.

Imports are read with ``ast`` (nothing is executed), wherever they appear: at
module level, inside a function, or under ``if TYPE_CHECKING``, because a
function-level import that closes a cycle is still a cycle a reader must
untangle. ``from dtlab.x import y`` is an edge to ``dtlab.x.y`` when that is a
module and to ``dtlab.x`` otherwise.

Planes (docs/architecture.md): the lab (``dtlab.lab``) is the caller's side in
the notebook kernel; only the lab itself, the course plane (``dtlab.course``),
the CLI and the package's lazy ``__init__`` may import it. The engine, which is
everything but the course, the lab, the benchmarks and the CLI, imports none of
those four.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dtlab"
MAX_MODULE_LINES = 400  # "about 300" (STYLE.md), in ruff format's layout (a call's arguments one per line)
MAX_FUNCTION_LINES = 80  # "about 60" before ruff format spread calls over more lines
EXEMPT = "long because"  # a docstring that says why may exceed either limit
HARD_MODULE_LINES = 400  # no exemption past this (docs/architecture.md)
LAB_IMPORTERS = ("dtlab.lab", "dtlab.course", "dtlab.cli", "dtlab")
NOT_ENGINE = ("dtlab.course", "dtlab.lab", "dtlab.bench", "dtlab.cli", "dtlab.__main__")
PLANES = (
    "comm",
    "parallel",
    "numerics",
    "config",
    "state",
    "measure",
    "planner",
    "course",
    "lab",
    "bench",
    "launch",
    "train",
    "cluster",
)
MAX_TOP_MODULES = 8


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _target(name: str) -> str | None:
    """The dtlab module an import of ``name`` loads last (its own file), or None if outside dtlab."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.add(_target(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                edges.add(_target(full) if full in MODULES else _target(base))
    edges.discard(None)
    edges.discard(name)
    return edges


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walk_sees_known_edges():
    # Guards the checker itself: if it found no edges, "no cycle" would mean nothing.
    assert sum(len(v) for v in GRAPH.values()) > 50
    assert "dtlab.config" in GRAPH["dtlab.config.flags"] and "dtlab.config.flags" in GRAPH["dtlab.cli"]


def test_no_import_cycle():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_engine_never_imports_the_lab():
    offenders = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        for dep in deps
        if (dep == "dtlab.lab" or dep.startswith("dtlab.lab."))
        and not (name == "dtlab" or any(name == p or name.startswith(p + ".") for p in LAB_IMPORTERS[:-1]))
    )
    assert not offenders, "\n".join(offenders)


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            doc = (ast.get_docstring(node) or "").lower()
            if length > MAX_FUNCTION_LINES and EXEMPT not in doc:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}() is {length} lines")
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name):
    path = MODULES[name]
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n") + 1
    doc = (ast.get_docstring(ast.parse(text)) or "").lower()
    problems = _long_functions(path)
    if lines > MAX_MODULE_LINES and EXEMPT not in doc:
        problems.append(f"{path.relative_to(PACKAGE.parent)} is {lines} lines")
    assert not problems, (
        "; ".join(problems) + f" (over ~{MAX_MODULE_LINES}/{MAX_FUNCTION_LINES} lines: split it, "
        f"or say in its docstring why it is '{EXEMPT} ...')"
    )


def _within(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_engine_imports_neither_course_nor_lab():
    offenders = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        for dep in deps
        if name != "dtlab" and not _within(name, NOT_ENGINE) and _within(dep, NOT_ENGINE)
    )
    assert not offenders, "\n".join(offenders)


def test_a_package_per_plane_and_few_modules_on_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules directly in dtlab/ (at most {MAX_TOP_MODULES}): {top}"
    missing = [plane for plane in PLANES if not (PACKAGE / plane / "__init__.py").is_file()]
    assert not missing, f"planes without a package: {missing}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_the_hard_limit(name):
    lines = MODULES[name].read_text(encoding="utf-8").count("\n") + 1
    assert lines <= HARD_MODULE_LINES, f"{MODULES[name]} is {lines} lines (at most {HARD_MODULE_LINES}, no exemption)"


def test_public_paths():
    """What a user imports keeps working, from the paths README and docs/architecture.md give."""
    import dtlab
    from dtlab.config.train_config import TrainConfig
    from dtlab.parallel import ColumnParallelLinear, OverlappedDP, RowParallelLinear, ZeroOptimizer, ZeroStage3
    from dtlab.parallel.data_parallel import OverlappedDP as home_dp
    from dtlab.parallel.tensor_parallel import ColumnParallelLinear as home_col
    from dtlab.parallel.tensor_parallel import RowParallelLinear as home_row
    from dtlab.parallel.zero.stage3 import ZeroStage3 as home_z3
    from dtlab.parallel.zero.stage12 import ZeroOptimizer as home_z12
    from dtlab.planner import plan

    assert dtlab.TrainConfig is TrainConfig and dtlab.plan is plan and callable(dtlab.train)
    assert (OverlappedDP, ZeroOptimizer, ZeroStage3, ColumnParallelLinear, RowParallelLinear) == (
        home_dp,
        home_z12,
        home_z3,
        home_col,
        home_row,
    )
    with pytest.raises(AttributeError):
        import dtlab.parallel as parallel

        parallel.NoSuchClass  # noqa: B018
