"""The main job's learning curve: what it says about success and about the operator's effort."""

from types import SimpleNamespace

import pytest

from robot_rl.app.learning_curve import LearningCurve


def episode(steps: int, driven: int, success: bool):
    return SimpleNamespace(num_steps=steps, intervention_steps=driven, success=success)


def test_operator_effort_counts_the_steps_the_operator_drove_and_autonomy_excludes_rescues():
    curve = LearningCurve()
    curve.add("sim-0", episode(100, 0, True), 0)
    curve.add("sim-1", episode(300, 60, True), 0)   # rescued: a success, not an autonomous one
    curve.add("sim-0", episode(200, 15, False), 1)
    effort = curve.operator_effort()
    assert effort == {"episodes_taken_over": 2, "steps_driven": 75, "share_of_steps": pytest.approx(75 / 600)}
    assert [r.autonomous for r in curve.records] == [True, False, False]


def test_operator_effort_of_an_empty_curve_is_zero_not_a_division_error():
    assert LearningCurve().operator_effort() == {"episodes_taken_over": 0, "steps_driven": 0, "share_of_steps": 0.0}
