"""The main job on several task families: refusals before anything trains, and the per-family
held-out block of its summary."""

from __future__ import annotations

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robot_rl.app import main_job
from robot_rl.app.family_check import MissingFamilyError, check_task_families
from robot_rl.app.heldout_monitor import HeldoutPoint
from robot_rl.app.learning_curve import LearningCurve
from robot_rl.config import load_config
from robot_rl.core.statistics import compare_paired

ALL = "task_families=[pick,push,place]"
TASKS = {"pick": "pick up the red cube", "push": "push the red cube to the left",
         "place": "put the red cube in the bowl"}


def demos_holding(directory: Path, *families: str) -> Path:
    """A demonstrations dataset's task table (what the check reads) with one task per family."""
    (directory / "meta").mkdir(parents=True)
    tasks = [TASKS[f] for f in families]
    table = pa.table({"task_index": list(range(len(tasks))), "task": tasks})
    pq.write_table(table, directory / "meta" / "tasks.parquet")
    return directory


def test_a_family_the_demonstrations_lack_is_refused_in_one_line_before_anything_trains(tmp_path, monkeypatch):
    demos = demos_holding(tmp_path / "demos", "push")
    cfg = load_config([f"output_dir={tmp_path}", ALL, f"demos.dir={demos}", "run.eval_episodes=120"])

    def no_training(_cfg):
        raise AssertionError("a BC start was looked for before the refusal")

    monkeypatch.setattr(main_job, "ensure_bc_checkpoint", no_training)
    with pytest.raises(MissingFamilyError) as refused:
        main_job.run_main_job(cfg)
    message = str(refused.value)
    assert "\n" not in message
    assert "no demonstrations of pick, place" in message and str(demos) in message and "holds push" in message
    assert "robot-rl record-demos 'task_families=[pick,push,place]'" in message and "robot-rl train-bc" in message


def test_the_learners_own_demonstrations_are_the_ones_checked(tmp_path):
    three = demos_holding(tmp_path / "three", "pick", "push", "place")
    push_only = demos_holding(tmp_path / "push", "push")
    families = ["pick", "push", "place"]
    check_task_families(load_config([ALL, f"demos.dir={push_only}", f"learner.store.demonstrations={three}"]), families)
    with pytest.raises(MissingFamilyError, match="no demonstrations of pick, place"):
        check_task_families(load_config([ALL, f"demos.dir={three}", f"learner.store.demonstrations={push_only}"]),
                            families)


def test_demonstrations_not_recorded_yet_are_recorded_for_every_family_and_pass(tmp_path):
    check_task_families(load_config([ALL, f"demos.dir={tmp_path / 'none'}"]), ["pick", "push", "place"])


@pytest.mark.parametrize("setting, families, unscored", [("run.eval_episodes=2", ["pick", "push", "place"], "place"),
                                                        ("run.heldout_scenes=1", ["pick", "push"], "push")])
def test_a_family_without_held_out_scenes_is_refused_in_one_line(tmp_path, setting, families, unscored):
    demos = demos_holding(tmp_path / "demos", *families)
    cfg = load_config([f"task_families=[{','.join(families)}]", f"demos.dir={demos}", setting])
    with pytest.raises(MissingFamilyError) as refused:
        check_task_families(cfg, families)
    name = setting.split("=")[0]
    assert str(refused.value).startswith(f"task_families: {unscored} would get no held-out scene: {setting} ")
    assert f"set {name} to a multiple of {len(families)}" in str(refused.value) and "\n" not in str(refused.value)
    off = load_config([f"task_families=[{','.join(families)}]", f"demos.dir={demos}", f"{name}=0"])
    check_task_families(off, families)  # 0: that check is off, nothing to leave out


def scored(successes: list[bool], families: list[str]) -> dict:
    """What the held-out child returns for one set of weights."""
    return {"success": sum(successes) / len(successes), "ci95": [0.1, 0.9], "episodes": len(successes),
            "per_episode_success": successes, "per_episode_family": families}


def test_the_summary_scores_each_family_start_against_final_on_its_own_scenes(tmp_path, capsys):
    families = ["pick", "push", "place"] * 8  # 24 scenes, the families rotating as the held-out scenes do
    start = [f == "push" and i % 2 == 0 for i, f in enumerate(families)]  # push 4 of 8, pick and place none
    final = [f != "place" or i < 6 for i, f in enumerate(families)]  # pick and push all, place 2 of 8
    heldout = {"episodes": 24, "start": scored(start, families), "final": scored(final, families),
               "final_vs_start": None}
    points = [HeldoutPoint(3, 300, 15, 90.0, 0.5, (0.3, 0.7), 24,
                           {"pick": {"success": 0.5, "ci95": [0.2, 0.8], "scenes": 8},
                            "push": {"success": 0.75, "ci95": [0.4, 0.9], "scenes": 8}})]
    result = SimpleNamespace(episodes=30, steps=3000, updates=900, updates_with_robots=900, weights_version=9,
                             robot_versions={}, checkpoint=None,
                             family_shares={"pick": 0.33, "place": 0.34, "push": 0.33}, served_chunks=None,
                             stopped_early=False)
    summary = main_job.summarize(LearningCurve(), result, tmp_path / "run", 20, "bc", heldout=heldout,
                                 heldout_points=points, ended_s=60.0)
    by_family = summary["heldout_by_family"]
    assert list(by_family) == ["pick", "push", "place"]
    assert {f: (s["start"], s["final"], s["n"]) for f, s in by_family.items()} == {
        "pick": (0.0, 1.0, 8), "push": (0.5, 1.0, 8), "place": (0.0, 0.25, 8)}
    pick = [i for i, f in enumerate(families) if f == "pick"]
    assert by_family["pick"]["p"] == pytest.approx(
        compare_paired([final[i] for i in pick], [start[i] for i in pick]).p_value)
    assert by_family["pick"]["p"] < 0.01 < by_family["push"]["p"]  # 8 of 8 scenes turned against 4 of 8
    low, high = by_family["place"]["final_ci"]
    assert low < 0.25 < high and by_family["place"]["start_ci"][0] == 0.0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["heldout_by_family"] == by_family
    main_job.print_summary(summary)
    out = capsys.readouterr().out
    assert "  push: start 50% (" in out and "-> final 100% (" in out and "on 8 scenes" in out
    assert sum(line.startswith(("  pick:", "  push:", "  place:")) for line in out.splitlines()) == 3
    assert "samples trained on per task family: pick 33%, place 34%, push 33%" in out
    push_only = {"heldout_by_family": {"push": by_family["push"]}, "family_shares": {"push": 1.0}}
    main_job.print_summary({**summary, **push_only})
    out = capsys.readouterr().out
    assert "  push:" not in out and "per task family" not in out  # one family: the overall lines say it all


def test_the_learning_curve_draws_each_family_where_it_draws_all_scenes():
    points = [HeldoutPoint(v, 100 * v, 5 * v, 30.0 * v, 0.5, (0.3, 0.7), 6,
                           {f: {"success": 0.5, "ci95": [0.2, 0.8], "scenes": 3} for f in ("pick", "push")})
              for v in (1, 2)]
    by_family = {f: {"start": 0.0, "final": 1.0, "start_ci": [0.0, 0.5], "final_ci": [0.5, 1.0], "n": 3, "p": 0.25}
                 for f in ("pick", "push")}
    heldout = {"episodes": 6, "start": {"success": 0.0, "ci95": [0.0, 0.4]},
               "final": {"success": 1.0, "ci95": [0.6, 1.0]}}
    drawn = main_job.heldout_curve_points(heldout, points, by_family, episodes=10, ended_s=50.0)
    per_family = {(p.family, p.endpoints) for p in drawn if p.family}
    assert per_family == {("pick", False), ("push", False), ("pick", True), ("push", True)}
    assert len([p for p in drawn if p.family == "pick" and not p.endpoints]) == 2  # a line through its versions
    one_family = [HeldoutPoint(1, 100, 5, 30.0, 0.5, (0.3, 0.7), 6, {"push": {"success": 0.5, "ci95": [0, 1],
                                                                              "scenes": 6}})]
    assert not [p for p in main_job.heldout_curve_points(None, one_family, {}, 10, 50.0) if p.family]
