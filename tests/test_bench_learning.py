"""`robot-rl bench learning`: curve arithmetic, report shape, settings, and the synchronous loop's phases."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import threading
import time
from pathlib import Path

import pytest

from robot_rl.app import sync_baseline
from robot_rl.app.learning_curve import EpisodeRecord
from robot_rl.app.sync_baseline import SyncRounds
from robot_rl.bench import learning
from robot_rl.bench.config import ARMS, LearningBenchConfig
from robot_rl.bench.learning import ArmResult, build_report, curve_points, first_reaching
from robot_rl.config import ConfigError, load_config

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel


def records(outcomes: str, seconds_per_episode: float = 10.0) -> list[EpisodeRecord]:
    """'A' autonomous success, 'R' success rescued by the operator, 'F' failure without takeover."""
    return [EpisodeRecord(index=i, robot_id=f"sim-{i % 2}", wall_s=(i + 1) * seconds_per_episode, policy_version=0,
                          success=c in "AR", intervened=c == "R", intervention_frac=0.5 if c == "R" else 0.0,
                          steps=100)
            for i, c in enumerate(outcomes)]


# ---------------------------------------------------------------- curves


def test_rolling_success_counts_only_autonomous_successes():
    points = curve_points(records("RRAA"), window=2)
    assert [p["episodes"] for p in points] == [1, 2, 3, 4]
    assert [p["success"] for p in points] == [0.0, 0.0, 0.5, 1.0]  # rescued episodes are not successes
    assert [p["intervention_rate"] for p in points] == [1.0, 1.0, 0.5, 0.0]
    assert [p["wall_s"] for p in points] == [10.0, 20.0, 30.0, 40.0]


def test_first_reaching_needs_a_full_window():
    # Episode 1 alone is 100 % but the window (4) is not full; episodes 4 and 5 are at 3/4 < 80 %; 6 is at 4/4.
    points = curve_points(records("AFAAAAF"), window=4)
    assert points[0]["success"] == 1.0
    reached = first_reaching(points, window=4)
    assert reached is not None and reached["episodes"] == 6 and reached["wall_s"] == 60.0
    assert first_reaching(curve_points(records("AAAFAFAF"), window=4), window=4) is None
    assert first_reaching(curve_points(records("A"), window=4), window=4) is None


def test_report_has_the_issue_keys_and_compares_sync_with_async():
    config = LearningBenchConfig(window=2, arms=["none", "rwr", "rwr_sync"])
    report = build_report([
        ArmResult("none", records("FFFF")),
        ArmResult("rwr", records("FAAA", seconds_per_episode=10.0), updates=300, weights_version=6),
        ArmResult("rwr_sync", records("FFAA", seconds_per_episode=20.0), updates=100, weights_version=2),
    ], config)
    assert set(report["curves"]) == set(report["final"]) == {"none", "rwr", "rwr_sync"}
    assert set(report["curves"]["rwr"][0]) == {"episodes", "wall_s", "success", "intervention_rate"}
    assert report["final"]["none"] == {"success": 0.0, "episodes_to_80": None, "heldout_success": None}
    assert report["final"]["rwr"] == {"success": 1.0, "episodes_to_80": 3, "heldout_success": None}
    sva = report["sync_vs_async"]
    assert sva["wall_s_to_80_async"] == 30.0 and sva["wall_s_to_80_sync"] == 80.0
    assert sva["async_over_sync_wall_s_to_80"] == pytest.approx(0.375)
    assert sva["success_at_budget_async"] == 1.0 and sva["success_at_budget_sync"] == 1.0
    assert report["arms"]["rwr"]["updates"] == 300 and "autonomous success" in report["notes"]
    json.dumps(report, allow_nan=False)  # plain JSON: no NaN anywhere


def test_heldout_evaluation_of_the_final_weights_lands_in_final_and_in_the_table(tmp_path, monkeypatch, capsys):
    from robot_rl.app.evaluation import HeldoutJob, evaluate_weights, heldout_eval
    from tests.learner_helpers import tiny_sim_weights

    _, cfg = tiny_sim_weights(tmp_path / "weights", monkeypatch)
    heldout = evaluate_weights(tmp_path / "weights", HeldoutJob.of(cfg, 2), "held-out test")
    assert heldout["episodes"] == 2 and heldout["success"] == 0.0  # 6 ticks: too short to push anything
    assert heldout["weights"] == str(tmp_path / "weights") and heldout["ci95"][0] == 0.0 < heldout["ci95"][1]
    assert heldout_eval(tmp_path / "weights", cfg, 0, "off") is None

    report = build_report([ArmResult("rwr", records("FAAA"), heldout=heldout)],
                          LearningBenchConfig(window=2, arms=["rwr"]))
    assert report["final"]["rwr"]["heldout_success"] == 0.0 and report["arms"]["rwr"]["heldout"] == heldout
    assert heldout["per_episode_success"] == [False, False]  # scene by scene, for paired comparisons
    # Against a start that solved one of the two scenes: -50 points, in the table's "vs start" column.
    start = {**heldout, "success": 0.5, "per_episode_success": [True, False]}
    report["heldout_vs_start"] = learning.heldout_vs_start(report["arms"], start)
    assert report["heldout_vs_start"]["rwr"]["only_b"] == 1
    learning.print_table(report)
    out = capsys.readouterr().out
    assert "held-out" in out and "-50.0 (p=1)" in out


def test_heldout_evaluation_runs_in_a_fresh_process_and_a_failure_costs_no_results(tmp_path):
    """The child loads the real sentence encoder (offline), so the weights get real embeddings."""
    from robot_rl.app.evaluation import heldout_eval, heldout_eval_all
    from robot_rl.policies.flow_vla import FlowVLA
    from tests.learner_helpers import TINY_SIM, tiny_policy_config

    config = tiny_policy_config()
    config.cameras = ("front", "wrist")
    FlowVLA(config).save_pretrained(tmp_path / "weights")
    cfg = load_config([*TINY_SIM, "robot.max_episode_steps=4"])
    heldout = heldout_eval(tmp_path / "weights", cfg, 1, "child")
    assert heldout == {"success": 0.0, "ci95": heldout["ci95"], "episodes": 1, "weights": str(tmp_path / "weights"),
                       "per_episode_success": [False], "per_episode_family": ["push"]}
    assert heldout_eval(tmp_path / "missing", cfg, 1, "child") is None  # logged, not raised
    # Several weights in one child: a missing one costs only its own score.
    FlowVLA(config).save_pretrained(tmp_path / "later")
    scores = heldout_eval_all([tmp_path / "weights", tmp_path / "missing", tmp_path / "later"], cfg, 1, "child")
    assert [s and s["weights"] for s in scores] == [str(tmp_path / "weights"), None, str(tmp_path / "later")]


def test_arms_already_run_are_saved_when_a_later_arm_crashes(tmp_path, monkeypatch):
    from robot_rl.policies.flow_vla import FlowVLA

    monkeypatch.setattr(learning, "ensure_bc_checkpoint", lambda cfg: tmp_path / "bc")
    monkeypatch.setattr(learning, "ensure_demos", lambda cfg: tmp_path / "demos")
    monkeypatch.setattr(FlowVLA, "from_pretrained", classmethod(lambda cls, *a, **k: None))

    def fake_arm(name, *args):
        if name == "awr":
            raise KeyboardInterrupt  # an operator's Ctrl-C an hour in
        return ArmResult(name, records("AAFA"))

    monkeypatch.setattr(learning, "run_arm", fake_arm)
    bench = LearningBenchConfig(window=2, arms=["none", "rwr", "awr"], eval_episodes=0)
    with pytest.raises(KeyboardInterrupt):
        learning.run_learning_bench(lambda algorithm: None, bench, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / learning.PARTIAL_REPORT).read_text())
    assert list(saved["arms"]) == ["none", "rwr"] and saved["final"]["rwr"]["success"] == 0.5


def test_sync_vs_async_is_null_when_an_arm_never_reaches_80_or_did_not_run():
    report = build_report([ArmResult("rwr", records("FFFA"))], LearningBenchConfig(window=2, arms=["rwr"]))
    sva = report["sync_vs_async"]
    assert sva["wall_s_to_80_async"] is None and sva["wall_s_to_80_sync"] is None
    assert sva["success_at_budget_async"] == 0.5 and sva["success_at_budget_sync"] is None
    assert sva["async_over_sync_wall_s_to_80"] is None


def test_sync_vs_async_compares_hgdagger_with_its_own_sync_loop_when_rwr_s_pair_did_not_run():
    config = LearningBenchConfig(window=2, arms=["rwr", "hgdagger", "hgdagger_sync"])
    report = build_report([
        ArmResult("rwr", records("FFFA", seconds_per_episode=10.0)),
        ArmResult("hgdagger", records("FAAA", seconds_per_episode=10.0)),
        ArmResult("hgdagger_sync", records("FFFFAA", seconds_per_episode=20.0)),
    ], config)
    sva = report["sync_vs_async"]
    assert (sva["async_arm"], sva["sync_arm"]) == ("hgdagger", "hgdagger_sync")
    assert sva["wall_s_to_80_async"] == 30.0 and sva["wall_s_to_80_sync"] == 120.0
    assert ARMS["hgdagger_sync"].sync and ARMS["hgdagger_sync"].learner == "hgdagger"


def test_plot_and_table(tmp_path, capsys):
    config = LearningBenchConfig(window=2, arms=list(ARMS))
    report = build_report([ArmResult(name, records("FAAR")) for name in ARMS], config)
    png = learning.plot_arms(report, tmp_path / "learning.png")
    assert png.stat().st_size > 10_000
    learning.print_table(report)
    out = capsys.readouterr().out
    assert "rwr_no_intervention" in out and "sync vs async" in out


def timeline(successes: list[float | None], every_s: float = 120.0) -> list[dict]:
    return [{"wall_s": every_s * (i + 1), "updates": 100 * (i + 1), "version": i + 1, "episodes": 20 * (i + 1),
             "weights": f"/w/t{i}", "success": s, "ci95": None if s is None else [s - 0.1, s + 0.1]}
            for i, s in enumerate(successes)]


def test_sync_vs_async_off_the_heldout_timeline_of_saved_weights(tmp_path, capsys):
    """The live window says async reached 80 % first; the saved weights say when each really did."""
    config = LearningBenchConfig(window=2, arms=["rwr", "rwr_sync"], heldout_every_s=120.0)
    report = build_report([
        ArmResult("rwr", records("AAAA"), heldout_timeline=timeline([0.7, None, 0.85, 0.9])),
        ArmResult("rwr_sync", records("FFAA"), heldout_timeline=timeline([0.6, 0.7, 0.75, 0.8, 0.8])),
    ], config)
    sva = report["sync_vs_async"]
    assert sva["heldout_wall_s_to_80_async"] == 360.0  # the unscored copy at 240 s is skipped, not read as 0
    assert sva["heldout_wall_s_to_80_sync"] == 480.0
    assert sva["heldout_async_over_sync_wall_s_to_80"] == pytest.approx(0.75)
    assert sva["heldout_wall_s_to_90_async"] == 480.0 and sva["heldout_wall_s_to_90_sync"] is None
    assert sva["heldout_async_over_sync_wall_s_to_90"] is None  # the sync loop never got there
    assert report["arms"]["rwr"]["heldout_timeline"][2]["updates"] == 300
    json.dumps(report, allow_nan=False)
    png = learning.plot_arms(report, tmp_path / "learning.png")
    from PIL import Image

    assert Image.open(png).size[0] > Image.open(learning.plot_arms(build_report(
        [ArmResult("rwr", records("AAAA"))], config), tmp_path / "three.png")).size[0]  # a fourth panel
    learning.print_table(report)
    out = capsys.readouterr().out
    assert "held-out over robot time, rwr: 2 min 70% (100 upd), 6 min 85% (300 upd)" in out
    assert "async/sync 0.75" in out


def test_weights_timeline_saves_the_trainer_weights_at_robot_times(tmp_path):
    from robot_rl.bench.timeline import WeightsTimeline

    class Trainer:
        step = 0

        def save_deployed(self, directory):
            directory.mkdir(parents=True)
            (directory / "model.safetensors").write_bytes(b"w")
            return self.step, self.step // 50

    now = [1000.0]
    trainer = Trainer()
    line = WeightsTimeline(trainer, tmp_path / "timeline", 120.0, episodes=lambda: 7, clock=lambda: now[0])
    line._t0 = now[0]  # as ``start`` sets it, without the thread
    now[0] += 120.0
    trainer.step = 150
    first = line.take()
    now[0] += 121.4
    second = line.take()
    assert (first.wall_s, first.updates, first.version, first.episodes) == (120.0, 150, 3, 7)
    assert Path(first.weights).name == "t00120s" and Path(second.weights).name == "t00241s"
    assert [s.wall_s for s in line.snapshots] == [120.0, 241.4]
    with pytest.raises(ValueError, match="every_s"):
        WeightsTimeline(trainer, tmp_path, 0.0, episodes=lambda: 0)


# ---------------------------------------------------------------- settings


def test_bench_settings_are_typed_settings_of_the_bench_group():
    cfg = load_config(["+bench=learning", "bench.minutes_per_arm=3", "bench.arms=[none,rwr_sync]",
                       "run.max_episode_steps=150"])
    assert isinstance(cfg.bench, LearningBenchConfig)
    assert (cfg.bench.minutes_per_arm, cfg.bench.arms, cfg.run.max_episode_steps) == (3.0, ["none", "rwr_sync"], 150)


def test_quick_is_a_preset_and_explicit_settings_win():
    quick = load_config(["+bench=learning_quick", "bench.window=9"]).bench
    assert quick.minutes_per_arm == 1.0 and quick.window == 9
    assert load_config(["+bench=learning"]).bench == LearningBenchConfig()


@pytest.mark.parametrize("bad, match", [
    (["bench.arms=[rwr,ppo]"], "ppo"),
    (["bench.minutes=3"], "minutes_per_arm"),
    (["bench.window=0"], "window"),
    (["bench.minutes_per_arm=-1"], "minutes_per_arm"),
    (["bench.eval_episodes=-1"], "eval_episodes"),
    (["bench.heldout_every_s=-5"], "heldout_every_s"),
    (["bench.timeline_episodes=2.5"], "timeline_episodes"),
])
def test_bad_settings_are_refused_with_what_to_change(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config(["+bench=learning", *bad])


def test_the_arms_choose_the_learner(capsys):
    from robot_rl import cli

    assert cli.main(["bench", "learning", "learner=awr"]) == 2
    assert "arms choose the learner" in capsys.readouterr().err


def test_bench_command_dispatches_learning_and_hands_it_the_json_path(tmp_path, monkeypatch):
    from robot_rl.commands import bench

    seen = {}

    def fake_run(cfg, json_path=None, compose=None):
        seen.update(window=cfg.bench.window, minutes=cfg.bench.minutes_per_arm, json_path=json_path)
        return {"curves": {}}

    monkeypatch.setattr(learning, "run_from_cli", fake_run)
    out = tmp_path / "r" / "learning.json"
    assert bench.main(["learning", "--json", str(out), "--quick", "bench.window=3"]) == 0
    assert seen == {"window": 3, "minutes": 1.0, "json_path": out}
    assert json.loads(out.read_text())["curves"] == {}


# ---------------------------------------------------------------- the synchronous loop


class FakeTrainer:
    """Counts updates, publishes every ``every`` updates, and notes any update made while a robot acts."""

    def __init__(self, every: int, acting: list[int]) -> None:
        self.every, self.acting = every, acting
        self.step = self.version = 0
        self.overlaps = 0

    def update_once(self) -> dict:
        self.overlaps += self.acting[0] > 0
        time.sleep(0.002)
        self.step += 1
        if self.step % self.every == 0:
            self.version += 1
        return {"loss": 0.0}


class FakeStore:
    def stats(self) -> dict:
        return {"steps_ingested": 10**9, "episodes_open": 0}


def test_sync_rounds_alternate_collect_and_train_without_overlap():
    acting = [0]
    lock = threading.Lock()
    trainer = FakeTrainer(every=5, acting=acting)
    learner = type("Learner", (), {"trainer": trainer, "store": FakeStore()})()
    # The budget is three rounds (a clock that counts them), not a time: how many fit in a
    # second is the machine's speed. The training deadline only bounds a hang.
    rounds = SyncRounds(episodes_per_round=3, deadline_s=3, clock=lambda: rounds.round)
    deadline = time.monotonic() + 60.0
    versions_seen: list[int] = []

    def robot() -> None:
        while not rounds.robot_should_stop():
            with lock:
                acting[0] += 1
                versions_seen.append(trainer.version)  # the weights this episode starts with
            time.sleep(0.01)
            with lock:
                acting[0] -= 1
            rounds.episode_finished(steps=10)

    threads = [threading.Thread(target=robot) for _ in range(2)]
    for t in threads:
        t.start()
    sync_baseline._coordinate(learner, rounds, updates=5, deadline_s=deadline)
    for t in threads:
        t.join(5.0)
    assert not any(t.is_alive() for t in threads), "robots must stop when the budget ends"
    assert trainer.overlaps == 0, "the trainer updated while a robot was acting"
    assert (trainer.version, trainer.step) == (3, 15)  # one publish per round, after its 5 updates
    # Every round: exactly 3 episodes, all started on the weights the round before published.
    assert sorted(versions_seen) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert rounds.steps_collected == 10 * len(versions_seen)  # every started episode was counted when done


def test_sync_rounds_stop_waiting_robots_at_the_deadline():
    clock = [0.0]
    rounds = SyncRounds(episodes_per_round=1, deadline_s=10.0, clock=lambda: clock[0])
    assert rounds.robot_should_stop() is False  # the round's only episode
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(rounds.robot_should_stop()))
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive(), "a robot must wait while the round is full"
    clock[0] = 11.0
    waiter.join(2.0)
    assert result == [True]
    assert rounds.wait_collected() is False


def test_run_sync_on_the_real_learner_and_edge_runtime(tmp_path):
    """Tiny policy, kinematic robots, 12-tick episodes: rounds publish once each, data lands in the store."""
    from robot_rl.app.config import LocalRunConfig
    from robot_rl.edge.config import EdgeConfig
    from tests.learner_helpers import learner_config, tiny_policy
    from tests.test_stream_edge import CameraRobot

    config = learner_config(tmp_path)
    run = LocalRunConfig(num_robots=2, episodes_per_robot=10**6, max_steps=12, segment_steps=6,
                         spool_dir=str(tmp_path / "spool"), image_format="png", edge=EdgeConfig(fps=30),
                         time_budget_s=4.0)
    versions: list[int] = []
    result = sync_baseline.run_sync(config, tiny_policy(), run,
                                    lambda i: (CameraRobot(), None, lambda ep: "pick the cube"),
                                    collect_episodes=2, updates=3,
                                    on_episode=lambda robot_id, episode, version: versions.append(version))
    rounds = result.weights_version
    assert rounds >= 1, "no sync round in 4 s"  # how many fit is the benchmark's (a machine's speed)
    assert 3 * rounds <= result.updates < 3 * (rounds + 1)  # a last, cut-short train phase publishes nothing
    assert 2 * rounds <= result.episodes <= 2 * (rounds + 1) and len(versions) == result.episodes
    assert result.store["episodes_stored"] == result.episodes
    assert max(versions) >= 1 and max(result.robot_versions.values()) >= 1  # robots acted on new weights
    assert result.checkpoint is not None
