"""The package's layers import downward only (ARCHITECTURE.md).

Every `import` in `sim/` (at module level or inside a function, where most of the CLI's imports
are) is read from the source with `ast`; each module belongs to one layer, and a module may
import only its own package or a layer below its own. Imports under `if TYPE_CHECKING:` never
run and are allowed to name the engine's view records (the plug-in API documents them in
`sim.engine.view`). The rule is checked on the real tree and, so that the test can fail, on
planted upward imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (module prefix, layer, may also import these same-layer packages); longest prefix wins.
LAYERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "sim.native": (0, ()),
    "sim.native_build": (0, ("sim.native",)),
    "sim.core": (0, ()),
    "sim.workloads": (1, ()),
    "sim.latency": (1, ()),
    "sim.policies": (1, ()),
    "sim.engine": (2, ()),
    "sim.profiling": (2, ()),
    "sim.outputs": (3, ()),
    "sim.studies": (4, ()),
    "experiments": (5, ()),
    "sim.cli": (6, ()),
    "sim": (0, ()),  # sim/__init__.py
}


def layer_of(module: str) -> tuple[str, int, tuple[str, ...]]:
    # "sim" alone is sim/__init__.py: every other module of the package must sit in a layer
    best = max((p for p in LAYERS if module == p or (p != "sim" and module.startswith(p + "."))), key=len,
               default=None)
    if best is None:
        raise KeyError(module)
    return (best, *LAYERS[best])


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports_of(source: str, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every run-time import of sim or experiments in `source`."""
    tree = ast.parse(source)
    skip = _type_checking_lines(tree)
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from sim.core import tomlio` imports sim.core.tomlio
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(ln, m) for ln, m in found if m.split(".")[0] in ("sim", "experiments")]


def violations(source: str, module: str) -> list[str]:
    own, level, allowed = layer_of(module)
    out = []
    for line, target in imports_of(source, module):
        try:
            pkg, tlevel, _ = layer_of(target)
        except KeyError:
            continue
        if pkg == own or target.startswith(own + ".") or pkg in allowed or tlevel < level:
            continue
        out.append(f"{module}:{line} imports {target} (layer {tlevel} {pkg}; {own} is layer {level})")
    return out


def sim_modules():
    for path in sorted((REPO / "sim").rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path
    for path in sorted((REPO / "experiments").glob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        yield ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts), path


def test_every_module_has_a_layer():
    for module, _ in sim_modules():
        layer_of(module)


def test_imports_point_downward_only():
    found = [v for module, path in sim_modules() for v in violations(path.read_text(), module)]
    assert found == []


@pytest.mark.parametrize("module, line", [
    ("sim.engine.run", "from sim.studies.sweep import Runner"),          # engine -> studies
    ("sim.engine.pipeline", "    from sim.outputs.metrics import summarize"),  # engine -> outputs, in a function
    ("sim.latency.profiled", "from sim.profiling import build"),         # run-time latency -> profile tool chain
    ("sim.latency.cluster", "from sim.profiling.specs import ModelArch"),  # the cluster's costs -> tool chain
    ("sim.engine.cluster", "from sim.profiling.specs import load_gpu"),  # engine -> its sibling profile tool chain
    ("sim.latency.base", "import sim.cli"),                              # latency -> CLI
    ("sim.core.config", "from sim.policies import chunk_policies"),      # core -> a plug-in kind
    ("sim.policies.greedy", "from sim.engine.view import BatchInfo"),    # policies -> engine at run time
    ("sim.workloads.trace", "from sim.latency.base import BatchStats"),  # sibling layers
    ("sim.studies.plan", "from sim.cli.plan import add_commands"),       # studies -> CLI
])
def test_a_planted_upward_import_is_caught(module, line):
    src = "def f():\n" + line if line.startswith("    ") else line + "\n"
    assert len(violations(src, module)) == 1


def test_type_checking_imports_are_allowed():
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sim.engine.view import BatchInfo\n"
    assert violations(src, "sim.policies.rls") == []


# The capacity planner (`ppsim plan`), lowest first: each module imports only those before it, at any depth of
# a function, so that no planner module imports another sideways or upward (issue 39: plan.py and
# cluster_plan.py imported each other; concurrency_plan.py imported plan.py inside a function).
PLANNER = ("sim.studies.plan_candidates", "sim.studies.plan_probes", "sim.studies.plan_verify", "sim.studies.verdict",
           "sim.studies.plan_plot", "sim.studies.concurrency_plan", "sim.studies.cluster_plan", "sim.studies.plan")


def planner_violations(source: str, module: str) -> list[str]:
    below = PLANNER[:PLANNER.index(module)]
    out = []
    for line, target in imports_of(source, module):
        hit = max((m for m in PLANNER if target == m or target.startswith(m + ".")), key=len, default=None)
        if hit is not None and hit not in below:
            out.append(f"{module}:{line} imports {hit}, not below it in the planner")
    return out


def test_the_planner_modules_import_only_downward():
    found = []
    for module in PLANNER:
        path = REPO.joinpath(*module.split(".")).with_suffix(".py")
        found += planner_violations(path.read_text(), module)
    assert found == []


@pytest.mark.parametrize("module, line", [
    ("sim.studies.plan_candidates", "    from sim.studies.concurrency_plan import check_workload"),  # upward
    ("sim.studies.cluster_plan", "from sim.studies.plan import plan_load"),                        # upward
    ("sim.studies.concurrency_plan", "    from sim.studies import cluster_plan"),                  # upward
    ("sim.studies.plan_probes", "from sim.studies.plan_probes import label"),                      # itself
])
def test_a_planted_sideways_planner_import_is_caught(module, line):
    src = "def f():\n" + line if line.startswith("    ") else line + "\n"
    assert len(planner_violations(src, module)) == 1
