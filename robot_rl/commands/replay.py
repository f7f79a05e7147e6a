"""`robot-rl replay`: a logged dataset in the sim (``robot_rl.app.dataset_replay``)."""

from __future__ import annotations

from typing import Any

from robot_rl.config import load_config
from robot_rl.replay.report import print_table, tracking_table

HELP = """replay a logged dataset's actions open-loop in the sim: per-joint tracking error, one MP4 per
episode (logged cameras beside the sim's render, a timeline below) and a plot, under replay.out_dir;
with replay.counterfactual=true also what policy.path would have done at every logged step. A dataset
of another arm is mapped onto the sim's joints with replay.mapping (preset replay=radians_6dof).

  robot-rl replay replay.dataset=outputs/session replay.episode_indices=[0,2]
  robot-rl replay replay=radians_6dof replay.dataset=OWNER/NAME replay.counterfactual=true policy.path=DIR"""
GROUPS = ("robot", "viewer", "policy", "replay")


def main(argv: list[str]) -> int:
    # imported when the command runs, so that `robot-rl replay --help` answers without MuJoCo, OpenCV and LeRobot
    from robot_rl.app.dataset_replay import run_replay

    _print_summary(run_replay(load_config(argv)))
    return 0


def _print_summary(run: Any) -> None:

    print_table(tracking_table({r.index: r.tracking for r in run.episodes}))
    for result in run.episodes:
        if result.counterfactual is not None:
            cf = result.counterfactual.as_dict(k=3)
            worst = ", ".join(f"t={d['step']} ({d['chunk_error']:.2f})" for d in cf["top_deviations"])
            print(f"episode {result.index}: counterfactual chunk error {cf['mean_chunk_error']:.2f} "
                  f"(during interventions: {cf['mean_chunk_error_during_interventions']}); largest at {worst}")
        for path in (result.video, result.plot):
            if path is not None:
                print(f"wrote {path}")
    print(f"wrote {run.summary_path}")
