"""Layers only point down (docs/development.md): `schemas` < the runtime (`hpcbus/*.py`, `hpcbus/local`) <
`producers` / `consumers` (neither imports the other, and between two families of one side only the imports
`CROSS_FAMILY` names) < the commands (`hpcbus/cli.py`, `hpcbus/commands/`,
every `command.py`), no module imports itself back through others, and no import is relative. Read from the source with `ast`
(late imports inside functions count too), so a wrong import fails here before it is ever run."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hpcbus", "schemas", "producers", "consumers")
"""The source folders; `schemas`, `producers` and `consumers` are installed as `hpcbus.<folder>`."""

CROSS_FAMILY = {
    ("hpcbus.producers.ocs", "hpcbus.producers.ccbackend"): "cc-backend's job events, shared by both masters",
    (
        "hpcbus.producers.slurm",
        "hpcbus.producers.ccbackend",
    ): "cc-backend's job events, shared by both masters",
    ("hpcbus.producers.simulate", "hpcbus.producers.node"): "simulated nodes are the node agent's samples",
}
"""The imports allowed between two families of one side (`producers/<a>` -> `producers/<b>`), with why: any
other such import fails, so a family is not a grab bag for its neighbours."""

SCHEMAS, RUNTIME, COMPONENTS, COMMANDS = range(4)
NAMES = {SCHEMAS: "schemas", RUNTIME: "the runtime", COMPONENTS: "producers/consumers", COMMANDS: "commands"}


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] != "hpcbus":
        parts.insert(0, "hpcbus")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    parts = module.split(".")
    second = parts[1] if len(parts) > 1 else ""
    if second == "schemas":
        return SCHEMAS
    if parts[-1] == "command" or second in ("commands", "cli", "__main__"):
        return COMMANDS
    if second in ("producers", "consumers"):
        return COMPONENTS
    return RUNTIME


def sources(root: Path) -> Iterator[tuple[str, Path]]:
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            inside = path.relative_to(root / folder).parts
            if folder == "hpcbus" and inside[0] in FOLDERS:  # the links to the other folders
                continue
            yield module_of(path, root), path


def imports(path: Path, modules: set[str]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a project module; `from package import submodule` is an import of
    the submodule (it does not need what the package's `__init__` holds)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield node.lineno, sub if sub in modules else node.module


def family(module: str) -> str:
    """`hpcbus.producers.node.agent` -> `hpcbus.producers.node` (a component's folder, or its module)."""
    return ".".join(module.split(".")[:3])


def relative(path: Path) -> Iterator[int]:
    """Lines of `from . import x` / `from .x import y`: every import names the module it means."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            yield node.lineno


def layer_problems(root: Path) -> list[str]:
    """What points up or sideways, what uses the folders' own top-level names, and every import cycle."""
    paths = dict(sources(root))
    modules = set(paths)
    problems: list[str] = []
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in paths.items():
        where = path.relative_to(root)
        problems += [
            f"{where}:{line}: a relative import: write the module's hpcbus name" for line in relative(path)
        ]
        for line, target in imports(path, modules):
            top = target.split(".")[0]
            if top in FOLDERS[1:]:
                problems.append(f"{where}:{line}: imports {target}: use hpcbus.{target}")
                continue
            if target not in modules:
                continue
            edges[module].add(target)
            mine, theirs = layer(module), layer(target)
            sideways = mine == theirs == COMPONENTS and module.split(".")[1] != target.split(".")[1]
            if theirs > mine or sideways:
                problems.append(
                    f"{where}:{line}: {NAMES[mine]} module {module} imports {target} ({NAMES[theirs]})"
                )
            elif mine == theirs == COMPONENTS:
                pair = (family(module), family(target))
                if pair[0] != pair[1] and pair not in CROSS_FAMILY:
                    problems.append(f"{where}:{line}: {module} imports {target}: not in CROSS_FAMILY")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(edges)]
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a path back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(path_back(v, group, edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def path_back(start: str, group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside `group` (breadth first)."""
    came: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges[v] & group):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if w not in came:
                came[w] = v
                todo.append(w)
    return [start, start]


def test_layers_only_point_down_and_nothing_imports_itself_back() -> None:
    assert layer_problems(ROOT) == []


def test_tests_and_benchmarks_import_the_installed_name() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for folder in ("tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, target in imports(path, set())
        if target.split(".")[0] in FOLDERS[1:]
    ]
    assert wrong == []


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


BASE = {
    "hpcbus/__init__.py": "",
    "hpcbus/bus.py": "from hpcbus.schemas import names\n",
    "hpcbus/cli.py": "from hpcbus.consumers.influx import command\n",
    "schemas/__init__.py": "",
    "schemas/names.py": "import re\n",
    "producers/__init__.py": "",
    "producers/node/__init__.py": "",
    "producers/node/agent.py": "from hpcbus import bus\n",
    "consumers/__init__.py": "",
    "consumers/influx/__init__.py": "",
    "consumers/influx/command.py": "from hpcbus.commands import run\n",
    "hpcbus/commands/__init__.py": "",
    "hpcbus/commands/run.py": "from hpcbus.producers.node import agent\n",
}


def test_the_check_passes_a_tree_that_points_down(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    assert layer_problems(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "text", "wanted"),
    [
        (
            "schemas/names.py",
            "from hpcbus.bus import x\n",
            "schemas module hpcbus.schemas.names imports hpcbus.bus",
        ),
        ("hpcbus/bus.py", "def f():\n    from hpcbus.producers.node import agent\n", "the runtime module"),
        ("producers/node/agent.py", "import hpcbus.consumers.influx\n", "producers/consumers module"),
        (
            "producers/node/agent.py",
            "from hpcbus.commands.run import x\n",
            "imports hpcbus.commands.run (commands)",
        ),
        ("producers/node/agent.py", "from schemas.names import x\n", "use hpcbus.schemas.names"),
        ("schemas/names.py", "from hpcbus.schemas import other\n", "import cycle"),
        ("producers/node/agent.py", "from . import other\n", "a relative import"),
        ("producers/node/agent.py", "from hpcbus.producers.slurm import x\n", "not in CROSS_FAMILY"),
    ],
)
def test_the_check_fails_on_an_import_that_points_up_or_back(
    tmp_path: Path, name: str, text: str, wanted: str
) -> None:
    files = {**BASE, name: text}
    if wanted == "import cycle":
        files["schemas/other.py"] = "from hpcbus.schemas.names import x\n"
    if wanted == "not in CROSS_FAMILY":
        files["producers/slurm/__init__.py"] = "x = 1\n"
    write(tmp_path, files)
    problems = layer_problems(tmp_path)
    assert any(wanted in p for p in problems), problems
