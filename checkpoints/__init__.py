"""Checkpoints shipped with robot_rl (package data)."""
