"""Imports flow one way (docs/architecture.md): a test, because a lazy import inside a function
makes a cycle that nothing else notices until two modules need each other at start-up."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Installed package -> folder in this repository (setup.py maps the same).
FOLDERS = {"robot_rl": "robot_rl", "robot_rl.hardware": "hardware", "robot_rl.policies": "policies",
           "robot_rl.bridges": "bridges", "robot_rl.calibration": "calibration"}
FOUNDATIONS = ("robot_rl.hardware", "robot_rl.policies", "robot_rl.bridges")


def project_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def exported_from(package: str, modules: dict[str, Path]) -> dict[str, str]:
    """A package's lazy exports (``_EXPORTS = {name: submodule}`` in its ``__init__``): the module
    behind ``from package import name`` is the submodule, which the package imports on first use."""
    path = modules.get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return {name: f"{package}.{sub}" for name, sub in ast.literal_eval(node.value).items()}
    return {}


def imported(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """The project modules ``name`` imports anywhere (at the top, inside functions, under ``if
    TYPE_CHECKING``), each with whether it sits under ``if TYPE_CHECKING``. ``from package import x``
    names the submodule ``x`` where there is one, a lazily exported name its submodule, otherwise
    the package's ``__init__``."""
    found: list[tuple[str, bool]] = []

    class Visitor(ast.NodeVisitor):
        type_checking = False

        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                self.type_checking, outer = True, self.type_checking
                for child in node.body:
                    self.visit(child)
                self.type_checking = outer
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.extend((alias.name, self.type_checking) for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = node.module or ""
            if node.level:
                package = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*package, *([node.module] if node.module else [])])
            exports = exported_from(base, modules)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append((target if target in modules else exports.get(alias.name, base), self.type_checking))

    Visitor().visit(ast.parse(path.read_text()))
    return [(m, tc) for m, tc in found if m == "robot_rl" or m.startswith("robot_rl.")]


def area(module: str) -> str:
    """``robot_rl.learner.store`` -> ``robot_rl.learner``: the unit of layering."""
    return ".".join(module.split(".")[:2])


def area_graph() -> dict[str, set[str]]:
    """Areas and the areas they import, at run time (``if TYPE_CHECKING`` imports left out)."""
    graph: dict[str, set[str]] = defaultdict(set)
    modules = project_modules()
    for name, path in modules.items():
        for target, type_checking in imported(name, path, modules):
            if not type_checking and area(target) != area(name):
                graph[area(name)].add(area(target))
    return graph


def test_the_areas_of_the_project_import_each_other_without_a_cycle():
    graph = area_graph()
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append([*trail[trail.index(nxt):], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, f"import cycles: {[' -> '.join(c) for c in cycles]}"


def file_graph() -> dict[str, set[str]]:
    """Each project file and the project files it imports, every import counted: at the top, inside
    a function, under ``if TYPE_CHECKING``. A lazy import still runs, and a type-only one still
    means that the two files cannot be read, checked or moved without each other; either way a
    cycle says that some logic or type sits in the wrong file. A package's ``__init__`` counts as
    a file, but importing a submodule is not counted as importing its package's ``__init__``."""
    modules = project_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        graph[name] = {target for target, _ in imported(name, path, modules) if target in modules} - {name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that all reach each other (Tarjan), those of two nodes or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def shortest_cycle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """One shortest way from the group's first node back to itself, inside the group."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{group} is not strongly connected")


def test_the_files_of_the_project_import_each_other_without_a_cycle():
    modules = project_modules()
    graph = file_graph()

    def file(module: str) -> str:
        return str(modules[module].relative_to(REPO))

    cycles = []
    for group in strongly_connected(graph):
        cycle = shortest_cycle(graph, group)
        others = [file(m) for m in group if m not in cycle]
        cycles.append(" -> ".join(file(m) for m in cycle) + (f" (and through {', '.join(others)})" if others else ""))
    assert not cycles, "import cycles between files:\n" + "\n".join(cycles)


def test_a_lazy_import_a_type_only_import_and_a_lazily_exported_name_are_edges_of_the_file_graph(tmp_path):
    """What the check above counts: imports that never run at start-up name the files they need."""
    source = tmp_path / "example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from robot_rl.data import load_episode_arrays\n"
        "from robot_rl.core import clock\n"
        "if TYPE_CHECKING:\n"
        "    from robot_rl.edge.node import EdgeNode\n"
        "def later():\n"
        "    import robot_rl.replay.report\n"
    )
    found = imported("robot_rl.app.example", source, project_modules())
    assert found == [("robot_rl.data.reader", False), ("robot_rl.core.clock", False),
                     ("robot_rl.edge.node", True), ("robot_rl.replay.report", False)]


def test_a_cycle_is_reported_as_its_shortest_way_round():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert shortest_cycle(graph, ["a", "b", "c"]) == ["a", "b", "a"]


def test_core_imports_nothing_of_the_project_and_the_foundations_only_core():
    graph = area_graph()
    assert graph.get("robot_rl.core", set()) == set()
    for foundation in FOUNDATIONS:
        assert graph.get(foundation, set()) <= {"robot_rl.core"}, (foundation, graph.get(foundation))


def test_nothing_imports_the_commands():
    """``commands/`` parses and calls; what they share lives in ``app/`` (the CLI loads a command by name)."""
    graph = area_graph()
    assert sorted(a for a, targets in graph.items() if "robot_rl.commands" in targets) == []


def test_importing_a_package_leaves_its_heavy_members_unimported_until_one_is_used():
    """The lazy exports are what keep the CLI's ``--help`` and an edge PC's start-up from importing
    MuJoCo, LeRobot and PyTorch that the command never touches."""
    code = (
        "import sys\n"
        "import robot_rl.bridges.zmq, robot_rl.data, robot_rl.hardware.sim, robot_rl.policies.flow_vla, "
        "robot_rl.replay, robot_rl.session\n"
        "heavy = ('lerobot', 'mujoco', 'torch', 'pyarrow')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
        "from robot_rl.data import load_episode_arrays\n"
        "print(load_episode_arrays.__module__)\n"
        "try:\n"
        "    robot_rl.data.no_such_name\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded_at_import, reader_module, missing = result.stdout.splitlines()
    assert loaded_at_import == ""
    assert reader_module == "robot_rl.data.reader"
    assert missing == "module 'robot_rl.data' has no attribute 'no_such_name'"
