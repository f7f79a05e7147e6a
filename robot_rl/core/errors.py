"""Errors every part of the project may raise and the CLI reports as one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot be used, with what to change."""
