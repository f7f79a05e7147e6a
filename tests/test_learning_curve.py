"""The main job's learning curve: what it says about success and about the operator's effort."""

from types import SimpleNamespace

import pytest

from robot_rl.app.learning_curve import LearningCurve


def episode(steps: int, driven: int, success: bool, source: str = "task", verdict: bool | None = None,
            asked: bool = False):
    return SimpleNamespace(num_steps=steps, intervention_steps=driven, success=success, verdict_source=source,
                           verdict_success=success if verdict is None else verdict, asked=asked)


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


def test_verdicts_count_who_judged_how_often_the_operator_was_asked_and_how_often_the_detector_was_right():
    curve = LearningCurve()
    for success in (True, False):  # labelled by the operator, not asked
        curve.add("sim-0", episode(100, 0, success, "operator"), 0)
    curve.add("sim-0", episode(100, 0, True, "detector", verdict=True), 1)
    curve.add("sim-1", episode(100, 0, True, "detector", verdict=True), 1)
    curve.add("sim-1", episode(100, 0, False, "detector", verdict=True), 1)  # a wrong verdict
    curve.add("sim-0", episode(300, 0, False, "operator", asked=True), 1)
    assert curve.verdicts() == {"task": 0, "labelled": 2, "detector": 3, "asked": 1, "asked_fraction": 0.25,
                                "detector_accuracy": pytest.approx(2 / 3)}
    only_task = LearningCurve()
    only_task.add("sim-0", episode(100, 0, True), 0)
    assert only_task.verdicts()["asked_fraction"] is None and only_task.verdicts()["detector_accuracy"] is None
