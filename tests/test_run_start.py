"""Which policy `robot-rl run` and `bench learning` start from."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path

import pytest

from robot_rl.app import main_job as run_command
from robot_rl.app import policies as policy_loading
from robot_rl.app.learning_curve import LearningCurve
from robot_rl.config import ConfigError, load_config
from robot_rl.policies.flow_vla import FlowVLA
from robot_rl.policies.text_encoder import InstructionEncoder
from tests.learner_helpers import hashed_embeddings


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A checkpoint with the default model config, standing in for checkpoints/bc_push."""
    cfg = load_config([])
    model = FlowVLA(cfg.policy.model, text_encoder=InstructionEncoder(backend=hashed_embeddings))
    directory = tmp_path / "bc_push"
    model.save_pretrained(directory)
    monkeypatch.setattr(policy_loading, "SHIPPED_BC", directory)
    return directory


def test_default_config_starts_from_the_shipped_checkpoint(shipped, tmp_path):
    cfg = load_config([f"output_dir={tmp_path / 'out'}"])
    assert run_command.ensure_bc_checkpoint(cfg) == shipped


def test_a_trained_checkpoint_wins_over_the_shipped_one(shipped, tmp_path):
    cfg = load_config([f"output_dir={tmp_path / 'out'}"])
    trained = Path(cfg.bc.checkpoint_dir)
    trained.mkdir(parents=True)
    (trained / "model.safetensors").write_bytes(b"placeholder")
    assert run_command.ensure_bc_checkpoint(cfg) == trained


@pytest.mark.parametrize("override", ["policy.model.d_model=64", "task_families=[pick]", "task_families=null",
                                      "bc.use_shipped=false"])
def test_shipped_checkpoint_is_not_used_for_another_model_or_task_set(shipped, tmp_path, override):
    cfg = load_config([f"output_dir={tmp_path / 'out'}", override])
    assert policy_loading.shipped_bc_checkpoint(cfg) is None


def test_the_repository_ships_a_checkpoint_for_the_default_config():
    cfg = load_config([])
    assert policy_loading.shipped_bc_checkpoint(cfg) == policy_loading.SHIPPED_BC, (
        "checkpoints/bc_push is missing or no longer matches policy.model: retrain it with `robot-rl train-bc`")


def test_reports_name_the_checkpoint_really_loaded(shipped, tmp_path):
    cfg = load_config([f"output_dir={tmp_path / 'out'}"])
    assert policy_loading.policy_source(cfg) == str(shipped)  # not the (absent) bc.checkpoint_dir
    cfg = load_config([f"output_dir={tmp_path / 'out'}", "policy.path=some/hub-id"])
    assert policy_loading.policy_source(cfg) == "some/hub-id"


def test_local_runs_train_and_store_below_the_robots_priority(tmp_path):
    """Robots and learner share the CPU in `robot-rl run` / `bench learning`: training yields to control."""
    cfg = load_config([f"output_dir={tmp_path}"])
    config = run_command.local_learner_config(cfg, tmp_path / "bc", tmp_path / "run", demos=tmp_path / "demos")
    assert config.trainer.thread_nice == config.store.commit_nice == cfg.run.learner_nice > 0
    assert config.store.demonstrations == str(tmp_path / "demos") and config.init_checkpoint == str(tmp_path / "bc")
    standalone = load_config([f"output_dir={tmp_path}", "run.learner_nice=0"])
    assert run_command.local_learner_config(standalone, tmp_path / "bc", tmp_path / "run", tmp_path / "d") \
        .trainer.thread_nice == 0


def test_a_thread_can_lower_its_own_priority_without_touching_the_caller():
    import threading

    from robot_rl.core.priority import lower_own_priority

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def worker() -> None:
        seen["lowered"] = lower_own_priority(5)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"lowered": True, "nice": min(19, before + 5)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    assert lower_own_priority(0) is False  # 0 = leave as is


@pytest.mark.parametrize("override, expected", [([], 1), (["run.torch_threads=null"], None)])
def test_local_runs_cap_torch_threads_unless_told_not_to(override, expected, monkeypatch):
    """Robots and learner share one process and the machine's cores: the default run caps PyTorch's
    intra-op threads (2.8 -> 4.3 updates/s on 2 cores, BENCHMARKS.md "store"); null leaves them alone."""
    import torch

    before = torch.get_num_threads()
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    run_command.share_cpu_with_robots(load_config(override))
    assert calls == ([] if expected is None else [expected])
    assert torch.get_num_threads() == before


def test_the_synchronous_loop_trains_with_a_thread_per_core(monkeypatch):
    """Its train phases have the CPU alone (the robots wait), so capping them would handicap it."""
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    run_command.share_cpu_with_robots(load_config([]), overlapping=False)
    assert calls == [len(os.sched_getaffinity(0))]


@pytest.mark.parametrize("override, match", [("run.robots=fibers", "run.robots"),
                                             ("run.eval_episodes=-1", "run.eval_episodes"),
                                             ("run.eval_episodes=lots", "run.eval_episodes"),
                                             ("run.min_updates=-5", "run.min_updates"),
                                             ("run.min_updates=1.5", "run.min_updates"),
                                             ("run.torch_threads=0", "run.torch_threads"),
                                             ("run.torch_threads=two", "run.torch_threads"),
                                             ("run.operator.stuck_tick=3", "stuck_tick")])
def test_bad_run_settings_are_refused_when_the_config_is_read(override, match):
    """Before anything runs: a run may train a BC start for minutes first."""
    with pytest.raises(ConfigError, match=match):
        load_config([override])


def test_the_run_ends_with_the_start_and_the_final_weights_on_the_same_unseen_scenes(tmp_path, monkeypatch, capsys):
    from robot_rl.app import evaluation as heldout

    calls = []

    def scored(weights, cfg, episodes, desc, policy_options=None):
        calls.append(([Path(w).name for w in weights], episodes, int(cfg.seed)))
        return [{"success": 0.6, "ci95": [0.45, 0.73]}, None]  # the final's child failed: said, not raised

    monkeypatch.setattr(heldout, "heldout_eval_all", scored)
    cfg = load_config([f"output_dir={tmp_path}", "seed=3", "run.eval_episodes=12"])
    result = run_command.start_vs_final(cfg, tmp_path / "bc_push", tmp_path / "step-00000900")
    assert calls == [(["bc_push", "step-00000900"], 12, 3)]  # one child, both weights, the run's seed
    summary = run_command.summarize(LearningCurve(), run_result(), tmp_path / "run", 20, "rwr", heldout=result)
    run_command.print_summary(summary)
    out = capsys.readouterr().out
    assert "start 60% (45%-73%) -> final not scored" in out
    assert result["final_vs_start"] is None  # one side not scored: no paired comparison

    def both_scored(weights, cfg, episodes, desc, policy_options=None):
        return [{"success": 0.25, "ci95": [0.05, 0.7], "per_episode_success": [False, True, False, False]},
                {"success": 1.0, "ci95": [0.5, 1.0], "per_episode_success": [True] * 4}]

    monkeypatch.setattr(heldout, "heldout_eval_all", both_scored)
    result = run_command.start_vs_final(cfg, tmp_path / "bc_push", tmp_path / "step-00000900")
    assert result["final_vs_start"]["only_a"] == 3 and result["final_vs_start"]["only_b"] == 0
    run_command.print_summary({**summary, "heldout": result})
    out = capsys.readouterr().out
    assert "final against start, scene by scene: +75.0 points" in out and "3 scenes only the final solved" in out
    assert run_command.start_vs_final(cfg, tmp_path / "bc_push", None) is None  # nothing trained: nothing to compare
    off = load_config([f"output_dir={tmp_path}", "run.eval_episodes=0"])
    assert run_command.start_vs_final(off, tmp_path / "bc_push", tmp_path / "step-00000900") is None
    assert len(calls) == 1


def test_run_operator_settings_reach_every_robots_operator_with_its_own_seed():
    from robot_rl.hardware.sim import SimConfig, SimSO101

    cfg = load_config(["run.operator.stuck_ticks=30", "run.operator.drive_ticks=90", "run.operator.seed=7"])
    factory = run_command.operator_factory(cfg)
    robot = SimSO101(SimConfig(seed=1))
    robot.connect()
    try:
        operators = [factory(index, robot).teleop for index in (0, 1)]
    finally:
        robot.disconnect()
    assert [op.config.stuck_ticks for op in operators] == [30, 30]
    assert [op.config.drive_ticks for op in operators] == [90, 90]
    assert [op.config.seed for op in operators] == [7, 8]
    assert run_command.operator_factory(load_config(["run.operator=null"])) is None


def test_the_run_names_its_learner_as_configured_with_the_data_it_imitates():
    """hgdagger is bc at 0 / 0.5 / 0.5: the plot and the table must say hgdagger and the mix, not 'bc'."""
    cfg = load_config(["learner=hgdagger"])
    config = run_command.local_learner_config(cfg, Path("bc"), Path("run"), demos=Path("demos"))
    assert run_command.learner_label(config) == "hgdagger, online / corrections / demonstrations 0 / 0.5 / 0.5"


def run_result(**overrides):
    """What ``run_local`` returns, as the summary reads it."""
    from types import SimpleNamespace

    base = dict(episodes=0, steps=0, updates=900, updates_with_robots=900, weights_version=9, robot_versions={},
                checkpoint=None, family_shares={}, served_chunks=None, stopped_early=False)
    return SimpleNamespace(**{**base, **overrides})


def test_the_summary_groups_versions_and_ends_with_lines_that_agree(tmp_path, capsys):
    """Versions with a few episodes each are merged into rows of 20 or more; the live window comes
    before the held-out scores, and the last lines (held-out, then where the files are) say the same."""
    from types import SimpleNamespace

    from robot_rl.app.heldout_monitor import HeldoutPoint

    curve = LearningCurve()
    for i in range(50):  # versions 0..9, five episodes each; later versions succeed more
        success = i % 5 < i // 10
        curve.add(f"sim-{i % 2}", SimpleNamespace(num_steps=100, intervention_steps=20 * (i < 10), success=success,
                                                  verdict_source="task", verdict_success=success, asked=False), i // 5)
    points = [HeldoutPoint(v, 100 * v, 5 * v, 30.0 * v, 0.1 * v, (0.0, 0.2 * v), 10) for v in (3, 6, 9)]
    heldout = {"episodes": 40, "start": {"success": 0.55, "ci95": [0.4, 0.7]},
               "final": {"success": 0.9, "ci95": [0.77, 0.96]}, "final_vs_start": None}
    summary = run_command.summarize(curve, run_result(episodes=50, steps=5000), tmp_path / "run", 20, "bc",
                                    heldout=heldout, learner="hgdagger, online / corrections / demonstrations",
                                    heldout_points=points, ended_s=400.0)
    groups = summary["per_version_groups"]
    assert [g["versions"] for g in groups] == ["v0-v3", "v4-v7", "v8-v9"]
    assert [g["episodes"] for g in groups] == [20, 20, 10] and sum(g["episodes"] for g in groups) == 50
    assert [p["version"] for p in summary["heldout_per_version"]] == [3, 6, 9]
    assert Path(summary["curve_png"]).stat().st_size > 0
    run_command.print_summary(summary)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "hgdagger" in "\n".join(lines[:3])  # the table's title names the learner as configured
    assert lines[-4].startswith("live, with the operator watching") and "interventions 40% -> 0%" in lines[-4]
    assert lines[-3].startswith("held-out while running") and "v3 30% -> v9 90%" in lines[-3]
    assert lines[-2] == ("held-out success on 40 unseen scenes, the weights alone: start 55% (40%-70%) -> "
                         "final 90% (77%-96%)")
    assert lines[-1].startswith("learning curve: ") and str(tmp_path / "run") in lines[-1]


def test_a_run_stopped_by_ctrl_c_says_so_and_how_to_score_its_weights(tmp_path, capsys):
    """No held-out check was run: the summary says the run stopped early and gives the command that
    scores the final weights against the start on the same scenes."""
    final, start = tmp_path / "run" / "checkpoints" / "step-00000300", tmp_path / "bc_push"
    summary = run_command.summarize(LearningCurve(), run_result(updates=300, checkpoint=final, stopped_early=True),
                                    tmp_path / "run", 20, "hgdagger", start=start)
    assert summary["stopped_early"] and summary["heldout"] is None
    run_command.print_summary(summary)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[-2].startswith("stopped early (Ctrl-C)")
    assert f"robot-rl eval policy.path={final} eval.compare_path={start}" in lines[-2]

