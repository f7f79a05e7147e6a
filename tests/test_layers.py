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


def imported(name: str, path: Path) -> list[str]:
    """Project modules ``name`` imports anywhere (functions included), except under ``if TYPE_CHECKING``."""
    found: list[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.extend(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                package = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                found.append(".".join([*package, *([node.module] if node.module else [])]))
            elif node.module:
                found.append(node.module)

    Visitor().visit(ast.parse(path.read_text()))
    return [m for m in found if m == "robot_rl" or m.startswith("robot_rl.")]


def area(module: str) -> str:
    """``robot_rl.learner.store`` -> ``robot_rl.learner``: the unit of layering."""
    return ".".join(module.split(".")[:2])


def area_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in project_modules().items():
        for target in imported(name, path):
            if area(target) != area(name):
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
