"""`robot-rl bench faults`, shortened: fuzzing of both learner sockets, impersonation, a kill -9 of the
learner and of a robot with restarts, a network cut, the damaged files and a full disk under the
learner's store, on real learner and robot processes. Each count that must be zero is checked one by
one, so a failure says which promise broke; the full run's numbers are the benchmark's (BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from robot_rl.bench.config import FaultsBenchConfig
from robot_rl.bench.faults import run_faults_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_short_fault_suite_loses_duplicates_poisons_and_admits_nothing():
    cfg = FaultsBenchConfig(robots=1, fuzz_messages=600, impersonation_tries=3, kills=1, seconds_between_kills=2.0,
                            edge_kills=1, network_cut_s=3.0, stale_hellos=200,
                            flood_subscriptions=0,  # the learner's memory under a flood is the benchmark's to report
                            corrupt_variants=["learner: store info.json garbled",
                                              "edge: LeRobot checkpoint weights truncated"],
                            max_restart_s=120.0)  # restart speed is the benchmark's to report, not this test's
    report = run_faults_bench(cfg, progress=lambda _msg: None)
    # Every step a robot made durable is stored, across a learner kill, a robot kill and a network cut;
    # only what the killed robot had not yet spooled may be missing.
    assert report["steps_durable"] >= 60 and report["edge_kills"] == 1
    assert report["steps_stored"] >= report["steps_durable"]
    assert report["steps_submitted"] - report["steps_stored"] <= report["steps_unspooled_at_edge_kills"]
    assert report["lost_steps"] == 0 and report["duplicated_steps"] == 0
    assert report["network_cut"]["steps_recorded_during_cut"] > 0  # kept recording while cut off
    assert report["poisoned_rows"] == 0
    assert report["impersonations_admitted"] == 0 and report["impersonation_attempts"] == 9
    fuzz = report["fuzz"]
    router, pub = fuzz["router"], fuzz["pub"]
    assert fuzz["messages"] == 1200 and fuzz["crashes"] == 0 and fuzz["hangs"] == 0
    assert router["messages"] == 600 and router["classes"] == 21 and router["keys"] == 12
    assert router["refusals_logged"] >= 300  # the messages reached the learner's checks, not only its socket
    assert router["garbage_sender_ignored"]  # and a key that went on past the bound was ignored, said once
    assert pub["messages"] == 600 and pub["classes"] == 7 and pub["connections_dropped"] >= 100
    assert report["files"] == {"checkpoint_with_nan_bytes": True, "truncated_checkpoint": True,
                               "garbled_spool_record": True, "full_disk_mid_write": True,
                               "learner_store_full_disk": True}
    # A robot's malformed segments are set aside and its clean ones behind them all stored; a connection's
    # stale ids are forgotten after the peer timeout.
    assert report["refused_then_clean"] == {"refused": 8, "clean_steps": 60, "clean_stored": 60}
    assert report["stale_ids"] == {"said_hello": 200, "live_peers": 1, "listed_after_timeout": 1}
    assert report["segments_left_staged"] == 0  # the learner's own dataset writer wrote everything
    # A robot killed mid-episode: the learner and its own dataset each miss at most one segment of it.
    crash = report["edge_kill_mid_episode"]
    assert crash["ticks_recorded"] >= 45 and crash["acked_after_restart"]
    for kept in (crash["ticks_stored"], crash["local_ticks"]):
        assert crash["ticks_recorded"] - crash["segment_ticks"] <= kept <= crash["ticks_recorded"] + 1
    corrupt = report["corrupt_files"]
    assert (corrupt["variants"], corrupt["one_line_exit_2"]) == (2, 2), corrupt["results"]
    assert len(report["restart_s"]) == 1 and report["learner_exit_code"] == 0 and report["passed"]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="episode_steps >= 10"):
        FaultsBenchConfig(episode_steps=5)
