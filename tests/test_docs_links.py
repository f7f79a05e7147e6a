"""The documentation names only files, modules and headings that exist.

A newcomer follows README.md, BENCHMARKS.md and docs/ into the code: a link to a moved file, a
backticked path to a renamed module or an anchor to a rewritten heading sends them nowhere, and
nothing else fails when that happens. These tests read every relative link, every backticked
repository path (``robot_rl/...py``, ``docs/...``) and dotted module (``robot_rl.app.x``) outside
code blocks, and every ``FILE.md#anchor``, and name each one that points at nothing.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
# The top-level folders and files a backticked path may start with (the repository's layout).
TOP_LEVEL = ("robot_rl", "hardware", "policies", "bridges", "calibration", "configs", "scripts",
             "tests", "docs", "checkpoints", "examples")
ROOT_FILES = ("README.md", "BENCHMARKS.md", "Makefile", "pyproject.toml", "setup.py")
FILE_SUFFIXES = ("py", "md", "yaml", "yml", "json", "png", "toml", "txt", "html", "sh")


def installed_folders() -> dict[str, str]:
    """setup.py's ``FOLDERS``: the top-level folders installed under ``robot_rl`` (``robot_rl.hardware``
    is ``hardware/``), read from its source so that the mapping is written once."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FOLDERS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py defines no FOLDERS")


FOLDERS = installed_folders()

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
# Placeholders and globs in a path say "some file like this", not one file.
PLACEHOLDER = re.compile(r"[*<>{}$]|\.\.\.|(^|[/_.-])(NAME|ROBOT|TIME|OUTPUT_DIR|DIR|PATH|ID|N)([/_.-]|$)")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            if count:
                seen[f"{base}-{count}"] = 1
    return set(seen)


def broken_link(doc: Path, target: str) -> str | None:
    """Why a relative link from ``doc`` leads nowhere, or None when it leads somewhere."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    file_part, _, anchor = target.partition("#")
    dest = (doc.parent / file_part).resolve() if file_part else doc
    if not dest.exists():
        return f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


def broken_path(text: str) -> str | None:
    """Why a backticked repository path names nothing, or None (also for text that is no path)."""
    candidate = text.strip().split("::")[0].rstrip(":,.")
    candidate = re.sub(r":\d+$", "", candidate)
    if " " in candidate or PLACEHOLDER.search(candidate):
        return None
    first = candidate.split("/")[0]
    if "/" in candidate and first in TOP_LEVEL or candidate in ROOT_FILES:
        return None if (ROOT / candidate).exists() else f"`{text}`: no such file"
    return None


def broken_module(text: str) -> str | None:
    """Why a backticked dotted name (``robot_rl.app.evaluation.evaluate_policy``) names no module.

    The dotted name walks packages and then one module; what follows the module is an attribute.
    A name that is no package, module or attribute of the package it sits in is reported."""
    parts = text.split(".")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text) or parts[0] != "robot_rl" \
            or parts[-1] in FILE_SUFFIXES:
        return None
    if ".".join(parts[:2]) in FOLDERS:
        here, parts = ROOT / FOLDERS[".".join(parts[:2])], parts[2:]
    else:
        here = ROOT
    for part in parts:
        if (here / part).is_dir():
            here = here / part
        elif (here / f"{part}.py").is_file():
            return None
        else:
            init = here / "__init__.py"
            exported = init.is_file() and re.search(rf"\b{re.escape(part)}\b", init.read_text())
            return None if exported else f"`{text}`: no module {here.relative_to(ROOT)}/{part}.py"
    return None


def problems(doc: Path) -> list[str]:
    found = []
    for number, line in prose_lines(doc):
        where = f"{doc.relative_to(ROOT)}:{number}"
        for target in LINK.findall(line):
            if (why := broken_link(doc, target)) is not None:
                found.append(f"{where}: {why}")
        for code in CODE.findall(LINK.sub("", line)):
            for check in (broken_path, broken_module):
                if (why := check(code)) is not None:
                    found.append(f"{where}: {why}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_in_the_docs_exists(doc):
    assert problems(doc) == []


def test_the_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """A missing file, a missing heading, a stale backticked path and a stale module are each
    named; an existing one of each, a URL and a placeholder are not."""
    doc = ROOT / "docs" / "index.md"
    assert broken_link(doc, "architecture.md#the-loop") is None
    assert broken_link(doc, "https://example.org/x.md") is None
    assert "no file" in broken_link(doc, "gone.md")
    assert "no heading #nowhere" in broken_link(doc, "architecture.md#nowhere")
    assert broken_path("robot_rl/core/statistics.py") is None
    assert "no such file" in broken_path("robot_rl/app/statistics.py")
    assert broken_path("configs/bench/NAME_quick.yaml") is None
    assert broken_path("output_dir=x") is None
    assert broken_module("robot_rl.app.evaluation.evaluate_policy") is None
    assert "no module" in broken_module("robot_rl.app.statistics.wilson")
    assert slug("main job: `robot-rl run` and `make demo`") == "main-job-robot-rl-run-and-make-demo"
