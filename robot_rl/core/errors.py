"""Errors every part of the project may raise and the CLI reports as one line."""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """A configuration that cannot be used, with what to change."""


class CorruptFileError(ConfigError):
    """A file the configuration leads to (a dataset's metadata or data, a checkpoint, a store's own
    records) that is there but cannot be read as what it should be: garbled, truncated, or not what
    its name says. The message is one line: the file, what is wrong with it, what to do."""

    def __init__(self, path: str | Path, problem: str, remedy: str) -> None:
        self.path = Path(path)
        self.problem = one_line(problem)
        self.remedy = one_line(remedy)
        super().__init__(f"{self.path}: {self.problem}; {self.remedy}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        """Rebuilt from its three parts (a pickle or a copy), as an exception with one message would be."""
        return type(self), (str(self.path), self.problem, self.remedy)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (a library's multi-line message) as one space."""
    return " ".join(text.split())
