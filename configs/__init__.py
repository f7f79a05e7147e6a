"""Hydra configs shipped with robot_rl: presets and deltas over the dataclass defaults."""
