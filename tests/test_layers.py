"""The package's layers, read from its source: imports go one way (docs/design.md draws them).

Every ``import`` of an ``hpcmem`` module counts, including those inside functions and under
``TYPE_CHECKING``: a lazy import is still a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hpcmem"

#: the producers: measure and write records
PRODUCERS = ("hpcmem.collectives", "hpcmem.train", "hpcmem.peers")
#: the only module of the results pipeline that may import a producer
REGISTRY = "hpcmem.results.registry"
#: the base: imports nothing of hpcmem but itself
BASE = ("hpcmem", "hpcmem.errors", "hpcmem.units", "hpcmem.outputs", "hpcmem.textfiles",
        "hpcmem.inputs")
#: the trainer integrations: above the libraries, beside the producers, imported by none
INTEGRATIONS = "hpcmem.integrations"
#: the budget strategies: siblings over the parts they share, never importing each other
STRATEGIES = ("hpcmem.um.host_optimizer", "hpcmem.um.streamed")
#: what the strategies share; it imports no strategy
BUDGET = "hpcmem.um.budget"
#: what each floor may not import (nor anything under it)
FORBIDDEN = {
    "hpcmem.record": (*PRODUCERS, INTEGRATIONS, "hpcmem.results", "hpcmem.draw",
                      "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.draw": (*PRODUCERS, INTEGRATIONS, "hpcmem.results", "hpcmem.workflow",
                    "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.node": ("hpcmem.record", *PRODUCERS, INTEGRATIONS, "hpcmem.results", "hpcmem.draw",
                    "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.um": ("hpcmem.record", *PRODUCERS, INTEGRATIONS, "hpcmem.results", "hpcmem.draw",
                  "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.hbw": ("hpcmem.record", *PRODUCERS, INTEGRATIONS, "hpcmem.results", "hpcmem.draw",
                   "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    INTEGRATIONS: ("hpcmem.record", *PRODUCERS, "hpcmem.results", "hpcmem.draw",
                   "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.collectives": ("hpcmem.train", "hpcmem.peers", INTEGRATIONS, "hpcmem.results",
                           "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.train": ("hpcmem.collectives", "hpcmem.peers", INTEGRATIONS, "hpcmem.results",
                     "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.peers": ("hpcmem.collectives", "hpcmem.train", "hpcmem.um", INTEGRATIONS,
                     "hpcmem.results", "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
    "hpcmem.results": (INTEGRATIONS, "hpcmem.workflow", "hpcmem.slurm", "hpcmem.cli"),
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_name(path): path for path in PACKAGE.rglob("*.py")}


def _imported(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *filter(None, [node.module])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield full if full in modules() else base


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the hpcmem modules it imports."""
    known = modules()
    return {module: frozenset(name for name in _imported(module, path)
                              if name in known and name != module)
            for module, path in known.items()}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges, index, low, stack, on_stack, found = graph(), {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_the_source() -> None:
    # guards the reader: a parser that found nothing would pass every check below
    assert "hpcmem.record.spec" in graph()["hpcmem.collectives.spec"]
    assert REGISTRY in graph()["hpcmem.results.aggregate"]


def test_no_import_cycle_among_the_modules() -> None:
    assert _cycles() == []


def test_each_floor_imports_nothing_above_it() -> None:
    wrong = [f"{module} imports {target}"
             for module, targets in graph().items()
             for floor, above in FORBIDDEN.items() if _under(module, floor)
             for target in sorted(targets) if any(_under(target, a) for a in above)]
    assert wrong == []


def test_the_base_imports_only_the_base() -> None:
    wrong = {module: sorted(set(graph()[module]) - set(BASE)) for module in BASE}
    assert {module: targets for module, targets in wrong.items() if targets} == {}


def test_the_budget_strategies_share_parts_and_never_import_each_other() -> None:
    assert "hpcmem.um.budget.transport" in graph()["hpcmem.um.host_optimizer.engine"]
    wrong = [f"{module} imports {target}"
             for module, targets in graph().items()
             for strategy in (*STRATEGIES, BUDGET) if _under(module, strategy)
             for other in STRATEGIES if other != strategy
             for target in sorted(targets) if _under(target, other)]
    assert wrong == []


def test_results_reach_a_producer_only_through_the_registry() -> None:
    wrong = [f"{module} imports {target}"
             for module, targets in graph().items()
             if _under(module, "hpcmem.results") and module != REGISTRY
             for target in sorted(targets) if any(_under(target, p) for p in PRODUCERS)]
    assert wrong == []


def test_a_measuring_process_loads_neither_the_results_pipeline_nor_the_report() -> None:
    code = ("import sys, hpcmem.cli.collectives, hpcmem.collectives.benchmark, "
            "hpcmem.train.benchmark, hpcmem.train.record, hpcmem.peers.variants; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(("
            "'hpcmem.results', 'hpcmem.draw', 'hpcmem.collectives.report', "
            "'hpcmem.train.report', 'hpcmem.peers.section', 'matplotlib', 'pandas')))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == []


def test_no_module_is_a_hub() -> None:
    # a module past 400 lines holds more than one concern: split it along its seams
    long = {name: lines for name, path in modules().items()
            if (lines := len(path.read_text().splitlines())) > 400}
    assert long == {}
