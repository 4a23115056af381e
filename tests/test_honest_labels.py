"""Honest labels: a value printed as "measured / 实测" in a lesson comes from a run, never from a model.

Read from the stored notebooks (code and outputs, both languages). Each
``check(name, predicted, value, source=...)`` call's ``value`` is traced back,
through the assignments, imports and the lesson's own functions in the cells
up to it, to the calls and imported names it is computed from. A value computed
from a formula, the planner or a simulation (:data:`MODELS`) and from no run
(:data:`RUNS`: ``dtlab.train``, :mod:`dtlab.launch`, the course's experiments,
a lab view that launches ranks, a run's ``wait()``) must not be checked as
``"measured"`` (the default): it says ``source="formula"``, ``"planner"`` or
``"simulated"``. A value labelled so must come from such a model. A cell that
prints "measured" or 实测 outside a check line must compute from a run. Check
lines come in pairs, English and Chinese, naming the same source.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RUN_MODULES = (
    "dtlab.launch",
    "dtlab.train",
    "dtlab.course.experiments",
    "dtlab.cluster",
    "dtlab.reference",
    "dtlab.bench",
)
RUN_CALLS = {"dtlab.train", "dtlab.run", "wait", "watch", "follow"}
MODELS = (
    "dtlab.planner",
    "dtlab.plan",
    "dtlab.parallel.pipeline.schedule",
    "dtlab.parallel.pipeline.simulate",
    "dtlab.parallel.pipeline.ideal_bubble_fraction",
    "dtlab.parallel.pipeline.max_in_flight",
    "dtlab.numerics.lr_schedule",
    "dtlab.parallel.moe.costs",
    "dtlab.parallel.moe.capacity",
    "dtlab.lab.offload_view.offload_cost",
    "dtlab.lab.pipeline_view",
    "dtlab.lab.loss_scaling_view",
    "dtlab.lab.ring_view",
    "dtlab.lab.all_to_all_view",
    "dtlab.cluster.hierarchical.inter_node_bytes",
    "dtlab.parallel.ring_attention.ring_schedule",
    "dtlab.grid",
    "dtlab.course.experiments.cluster.link_seconds",
)
"""Formulas, the planner and in-process simulations (lab views that step an algorithm without ranks).
A call to a lab view's class, method or function that starts no run (:func:`_launches_ranks`) is one too."""
FACTS = {
    "dtlab.config.MODEL_PRESETS",
    "param_count",
    "max",
    "min",
    "sum",
    "len",
    "round",
    "abs",
    "int",
    "float",
    "sorted",
    "list",
    "dict",
    "range",
}
"""Tables and arithmetic: a value computed from these alone is a formula, whatever its module."""
PREDICTED_NAME = re.compile(r"predict", re.I)
"""Names for the learner's predictions only (``my_prediction``): a model's output is ``model_s``, ``planner_...``."""
GPU = re.compile(r"\b(H100|H200|A100|V100|GPU)\b")
STORED_REPORT = "dtlab.course.experiments.one_gpu.stored_report"
"""Reads a GPU report ``tools/gpu_check.py`` measured and stored (notebooks/gpu_check.json): a run, on another machine."""
STORED_LABEL = re.compile(
    r"measured on [^,;]*\b(H100|H200|A100|V100|GPU)\b[^,;]*, \d{4}-\d{2}-\d{2}\b.*\bnot on this machine\b"
    r"|于 \d{4}-\d{2}-\d{2} 在 [^，；]*\b(H100|H200|A100|V100|GPU)\b[^，；]*上.*实测.*不是在本机"
)
"""How a stored GPU measurement is labelled: the device and the day it was measured on, and that it is not this
machine's ("measured on NVIDIA H200, 2026-12-04, ..., not on this machine")."""
LAB = Path(__file__).resolve().parent.parent / "dtlab" / "lab"


LAUNCHERS = ("dtlab.launch", "dtlab.course.experiments", "dtlab.train", "submit_request")


def _lab_view(origin: str) -> bool:
    parts = origin.split(".")
    return parts[:2] == ["dtlab", "lab"] and len(parts) > 3 and (LAB / f"{parts[2]}.py").exists()


def _launches_ranks(origin: str) -> bool:
    """A lab view's class (its constructor), method or function that starts runs on ranks.

    Followed through the methods and functions it calls, the methods that set
    the ``self`` attributes it reads, and the names the module imports from a
    run's modules; a view's ``lr_now()`` that only evaluates a formula is no
    run, even if its **Run** button trains.
    """
    if not _lab_view(origin):
        return False
    text = (LAB / f"{origin.split('.')[2]}.py").read_text()
    tree = ast.parse(text)
    defs = {n.name: [n] for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    launchers = LAUNCHERS + tuple(
        a.asname or a.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(LAUNCHERS)
        for a in n.names
    )
    names = origin.split(".")[3:]
    node = defs.get(names[0], [None])[0]
    if isinstance(node, ast.ClassDef):
        for fn in (n for n in node.body if isinstance(n, ast.FunctionDef)):
            defs[fn.name] = [fn]
        for fn in (n for n in node.body if isinstance(n, ast.FunctionDef)):
            for sub in ast.walk(fn):  # self.x = ...: reading x reaches this method
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and getattr(sub.value, "id", None) == "self"
                    and sub.attr not in defs
                ):
                    defs.setdefault("." + sub.attr, []).append(fn)
        node = defs.get(names[1] if len(names) > 1 else "__init__", [None])[0]
    todo, seen = [node] if node is not None else [], set()
    while todo:
        fn = todo.pop()
        source = ast.get_source_segment(text, fn) or ""
        if any(re.search(rf"\b{re.escape(m)}\b", source) for m in launchers):
            return True
        for sub in ast.walk(fn):
            name = sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", None)
            read = isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load)
            keys = (name, f".{name}") if read else (name,)
            for key in keys:
                for target in defs.get(key, ()):
                    if isinstance(target, ast.FunctionDef) and id(target) not in seen:
                        seen.add(id(target))
                        todo.append(target)
    return False


SOURCE_WORDS = {
    "measured": "实测",
    "formula": "公式",
    "planner": "规划器",
    "simulated": "模拟",
    "glossary": "术语表",
    "spec": "规格",
}
GLOSSARY = "dtlab.course.glossary"
"""A value labelled "glossary" is a term looked up there, and nothing else is."""
SPECS = (
    "dtlab.numerics.precision.format_table",
    "torch.finfo",
    "dtlab.numerics.fp8.format_table",  # e4m3 and e5m2, read from torch.finfo (the OCP FP8 specification)
    "dtlab.numerics.fp8.E4M3",
    "dtlab.numerics.fp8.E5M2",
)
"""A number format's definition (IEEE 754's fp16, bf16's layout): a value read from these is "spec", never
"measured", and a value labelled "spec" is read from them."""


def _code(cell: dict) -> str:
    text = "".join(cell["source"])
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))


class Provenance:
    """What the names of one notebook are computed from: imports, assignments, functions."""

    def __init__(self):
        self.imports: dict[str, str] = {}  # local name -> dotted origin
        self.values: dict[str, list[ast.AST]] = {}  # name -> expressions assigned to it
        self.functions: dict[str, ast.AST] = {}

    def add(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.imports[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and hasattr(node, "name"):
                self.functions[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in _names(target):
                        self.values.setdefault(name, []).append(node.value)
            elif isinstance(node, (ast.For, ast.comprehension)):
                for name in _names(node.target):
                    self.values.setdefault(name, []).append(node.iter)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                for name in _names(node.optional_vars):
                    self.values.setdefault(name, []).append(node.context_expr)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.attr in ("append", "update", "extend")
            ):
                self.values.setdefault(node.func.value.id, []).extend(node.args)  # x.append(v): x holds v

    def calls(self, expr: ast.AST) -> set[str]:
        """Dotted names of every call ``expr`` is computed from (through names and functions)."""
        found, seen, todo = set(), set(), [expr]
        while todo:
            node = todo.pop()
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call):
                    found.add(self._origin(sub.func))
                    if isinstance(sub.func, ast.Name) and sub.func.id in self.functions and sub.func.id not in seen:
                        seen.add(sub.func.id)
                        todo.append(self.functions[sub.func.id])
                if isinstance(sub, ast.Name) and sub.id in self.imports:
                    found.add(self.imports[sub.id])  # LINKS["pcie"]: a model's table
                if isinstance(sub, ast.Name) and sub.id not in seen:
                    seen.add(sub.id)
                    todo.extend(self.values.get(sub.id, ()))
        return found

    def _origin(self, func: ast.AST) -> str:
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if isinstance(func, ast.Name):
            made = [v for v in self.values.get(func.id, ()) if isinstance(v, ast.Call)]
            if func.id not in self.imports and made and _lab_view(self._origin(made[-1].func) + ".x"):
                parts.append(self._origin(made[-1].func))  # view.lr_now() -> ...WarmupView.lr_now
            else:
                parts.append(self.imports.get(func.id, func.id))
        return ".".join(reversed(parts)) if parts else ""


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _is_model(c: str) -> bool:
    return any(c == m or c.startswith(m + ".") for m in MODELS) or (_lab_view(c) and not _launches_ranks(c))


def from_a_run(calls: set[str]) -> bool:
    return any(
        not _is_model(c)
        and (c in RUN_CALLS or c.split(".")[-1] == "wait" or c.startswith(RUN_MODULES) or _launches_ranks(c))
        for c in calls
    )


def from_a_model(calls: set[str]) -> bool:
    return any(_is_model(c) for c in calls)


def _checks(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "check":
            kw = {k.arg: k.value for k in node.keywords}
            value = node.args[2] if len(node.args) > 2 else kw.get("measured")
            source = kw.get("source")
            yield node.lineno, value, (source.value if isinstance(source, ast.Constant) else "measured")


def label_problems(cells: list[dict]) -> list[str]:
    """Every dishonest label in a notebook's cells (``cells`` as nbformat stores them)."""
    problems, prov = [], Provenance()
    for n, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse(_code(cell))
        prov.add(tree)
        has_check = False
        for line, value, source in _checks(tree):
            has_check = True
            if value is None:
                continue
            calls = prov.calls(value)
            run, model = from_a_run(calls), from_a_model(calls) or bool(calls and calls <= FACTS)
            if source == "measured" and model and not run:
                problems.append(
                    f"cell {n} line {line}: checked as measured, computed by a model "
                    f"without a run (from {sorted(calls)})"
                )
            looked_up = any(c.startswith(GLOSSARY) for c in calls)
            if source == "measured" and looked_up and not run:
                problems.append(f"cell {n} line {line}: checked as measured, a glossary lookup")
            if source == "glossary" and not looked_up:
                problems.append(f"cell {n} line {line}: labelled glossary, looks nothing up")
            specified = any(c.startswith(SPECS) for c in calls)
            if source == "measured" and specified and not run:
                problems.append(f"cell {n} line {line}: checked as measured, a number format's definition")
            if source == "spec" and not specified:
                problems.append(f"cell {n} line {line}: labelled spec, reads no format's definition")
            if source not in ("measured", "glossary", "spec") and not model:
                problems.append(f"cell {n} line {line}: labelled {source}, computed by no model")
        problems += _predicted_names(n, tree, prov)
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        says = [
            ln
            for ln in text.splitlines()
            if re.search(r"measured|实测", ln, re.I) and not (has_check and ln.lstrip()[:1] in ("✓", "✗", "·"))
        ]
        if says and not from_a_run(prov.calls(tree)):
            problems.append(f"cell {n}: prints {says[0]!r} without a run")
        for ln in says:
            if re.search(r"predict|预测", ln, re.I):
                problems.append(f"cell {n}: calls a model's output a prediction beside a measurement: {ln!r}")
            if GPU.search(ln) and not stored_elsewhere(ln, prov.calls(tree)):
                problems.append(f"cell {n}: sets a measurement on this machine beside a GPU's: {ln!r}")
        problems += _pairs(n, text)
    return problems


def stored_elsewhere(line: str, calls: set[str]) -> bool:
    """A line that labels a stored GPU report's figures with their device and date, in a cell that reads the
    report: a GPU's measurement, set beside nothing of this machine's."""
    return STORED_REPORT in calls and bool(STORED_LABEL.search(line))


def _predicted_names(n: int, tree: ast.AST, prov: Provenance) -> list[str]:
    """A name that says "predicted" holds the learner's prediction, never a model's output."""
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for name in (x for t in node.targets for x in _names(t)):
                if PREDICTED_NAME.search(name) and from_a_model(prov.calls(node.value)):
                    problems.append(
                        f"cell {n}: {name} holds a model's output; name it for the model "
                        f"(model_s, planner_memory), not as a prediction"
                    )
    return problems


def _pairs(n: int, text: str) -> list[str]:
    """Check lines come in pairs, English then Chinese, naming the same source."""
    lines = text.splitlines()
    english = [ln for ln in lines if re.match(r"[✓✗·] .*(: predicted |: no prediction)", ln)]
    chinese = [ln for ln in lines if re.match(r"[✓✗·] .*(：预测 |：还没有)", ln)]
    problems = [] if len(english) == len(chinese) else [f"cell {n}: check lines in one language only"]
    for en, zh in zip(english, chinese):
        source = next((s for s in SOURCE_WORDS if f", {s} " in en or f"; {s} " in en), None)
        if source is None or SOURCE_WORDS[source] not in zh:
            problems.append(f"cell {n}: check lines without a matching source: {en!r} / {zh!r}")
    return problems


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_value_printed_as_measured_comes_from_a_run(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    assert label_problems(cells) == []


def _cells(*sources: str, output: str = "") -> list[dict]:
    return [
        {"cell_type": "code", "source": s, "outputs": [{"text": output}] if i == len(sources) - 1 else []}
        for i, s in enumerate(sources)
    ]


def test_the_checker_catches_a_formula_called_measured():
    imports = "import dtlab\nfrom dtlab.lab import check\nfrom dtlab.planner import model_states_bytes\n"
    formula = imports + "states = model_states_bytes(10)\nbytes_ = sum(states.values())\ncheck('b', 160, bytes_)"
    assert label_problems(_cells(formula)) != []
    assert label_problems(_cells(formula.replace("bytes_)", "bytes_, source='formula')"))) == []
    run = imports + "run = dtlab.train(dtlab.TrainConfig()).wait()\nm = run.records[-1]\ncheck('b', 1, m['mem'])"
    assert label_problems(_cells(run)) == []
    # through a function the lesson defines, and across cells
    assert (
        label_problems(_cells(imports + "def f():\n    return model_states_bytes(3)\n", "x = f()\ncheck('c', 1, x)"))
        != []
    )
    # a printed "measured" that is a formula's value
    assert (
        label_problems(_cells(imports + "print('measured', model_states_bytes(3))", output="measured {'params': 12}"))
        != []
    )
    # arithmetic on the presets is a formula, even with no formula module called
    facts = "from dtlab.config import MODEL_PRESETS\nfrom dtlab.lab import check\n"
    assert label_problems(_cells(facts + "x = MODEL_PRESETS['small'].param_count() * 2\ncheck('x', 1, x)")) != []
    # a model's output named like the learner's prediction
    assert label_problems(_cells(imports + "predicted_s = model_states_bytes(3)\n")) != []
    assert label_problems(_cells(imports + "model_s = model_states_bytes(3)\n")) == []
    # a planner's figure called "predicted" beside a measurement, and a GPU's time beside this machine's
    run_ = imports + "run = dtlab.train(dtlab.TrainConfig()).wait()\nprint(run)"
    assert label_problems(_cells(run_, output="activations measured / predicted = 0.8\n")) != []
    assert label_problems(_cells(run_, output="measured on this CPU: 73 ms; planner for one H100: 0.02 ms\n")) != []
    assert label_problems(_cells(run_, output="activations measured / planner = 0.8\n")) == []
    # a stored GPU report, labelled with its device and date and read from the report, is a GPU's measurement
    stored = (
        imports + "from dtlab.course.experiments import one_gpu\nr = one_gpu.stored_report('gpu_check.json')\nprint(r)"
    )
    label = "measured on NVIDIA H200, 2026-12-04, by tools/gpu_check.py, not on this machine\n"
    label_zh = "于 2026-12-04 在 NVIDIA H200 上由 tools/gpu_check.py 实测，不是在本机\n"
    assert label_problems(_cells(stored, output=label + label_zh)) == []
    assert label_problems(_cells(stored, output="measured on NVIDIA H200, not on this machine\n")) != []  # no date
    assert label_problems(_cells(stored, output="measured on NVIDIA H200, 2026-12-04\n")) != []  # could be here
    assert label_problems(_cells(run_, output=label)) != []  # a label the report was not read for
    # a check line whose Chinese twin names another source
    bad = "✓ b: predicted 1, formula 1\n✓ b：预测 1，实测 1\n"
    assert label_problems(_cells(imports + "check('b', 1, 1, source='formula')", output=bad)) != []


def test_a_formula_inside_a_view_or_a_run_package_is_no_run():
    # a lab view's method that evaluates a formula, though the view's Run button trains
    view = "from dtlab.lab import check\nfrom dtlab.lab.warmup_view import WarmupView\nv = WarmupView()\n"
    assert label_problems(_cells(view + "check('lr', 1, v.lr_now())")) != []
    assert label_problems(_cells(view + "check('lr', 1, v.lr_now(), source='formula')")) == []
    # a view whose method reads what an in-process measurement stored stays measured
    recompute = "from dtlab.lab import check\nfrom dtlab.lab.recompute_view import RecomputeView\nv = RecomputeView()\n"
    assert label_problems(_cells(recompute + "check('h', 1, v.held_now())")) == []
    # a formula of dtlab.cluster, whose other functions run ranks
    hier = "from dtlab.lab import check\nfrom dtlab.cluster.hierarchical import inter_node_bytes\n"
    assert label_problems(_cells(hier + "check('b', 1, inter_node_bytes(4, 2, 2, hierarchical=True))")) != []
    assert (
        label_problems(_cells(hier + "check('b', 1, inter_node_bytes(4, 2, 2, hierarchical=True), source='formula')"))
        == []
    )


def test_a_number_formats_definition_is_spec_not_measured():
    table = "from dtlab.lab import check\nfrom dtlab.numerics.precision import format_table\nrows = format_table()\n"
    assert label_problems(_cells(table + "check('f', 1, rows[0]['max'])")) != []
    assert label_problems(_cells(table + "check('f', 1, rows[0]['max'], source='spec')")) == []
    finfo = "import torch\nfrom dtlab.lab import check\n"
    assert label_problems(_cells(finfo + "check('f', 1, torch.finfo(torch.float16).max)")) != []
    assert label_problems(_cells(finfo + "check('f', 1, torch.finfo(torch.float16).max, source='spec')")) == []
    assert label_problems(_cells(finfo + "check('f', 1, 2 ** 15, source='spec')")) != []
