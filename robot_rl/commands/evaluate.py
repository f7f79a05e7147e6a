"""`robot-rl eval`: checkpoints on the same scenes in the sim (``robot_rl.app.eval_report``)."""

from __future__ import annotations

from robot_rl.config import load_config

HELP = """closed-loop success of policy.path in the sim through the real EdgeNode (mode and simulated
latency from the edge group), with 95 % intervals; with eval.compare_path a second checkpoint runs on
the same scenes and meets the same noise, and the two are compared scene by scene (exact McNemar p).
Scenes: eval.episodes seeds (families rotating over task_families), or eval.dataset's starting scenes.
Writes eval.json and a bar plot under eval.out_dir.

  robot-rl eval policy.path=outputs/bc_policy eval.episodes=40
  robot-rl eval policy.path=A eval.compare_path=B edge.simulated_latency_ms=200"""
GROUPS = ("robot", "policy", "edge", "eval", "seeds", "task_families")


def main(argv: list[str]) -> int:
    # imported when the command runs, so that `robot-rl eval --help` answers without MuJoCo and torch
    from robot_rl.app.eval_report import eval_table, run_eval
    from robot_rl.app.evaluation import paired_comparison
    from robot_rl.replay.report import print_table

    evals, json_path, plot_path = run_eval(load_config(argv))
    print_table(eval_table(evals))
    if len(evals) == 2:
        print(f"{evals[0].name} against {evals[1].name}, scene by scene: "
              f"{paired_comparison(*evals).describe('the first', 'the second')}")
    print(f"wrote {json_path}\nwrote {plot_path}")
    return 0
