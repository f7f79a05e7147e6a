"""`robot-rl bench sim`: the expert's cost per command, contact-free IK against the live model."""

from robot_rl.bench.sim import measure_expert_act_ms, print_table


def test_expert_act_cost_is_measured_for_both_ik_models_and_printed(capsys):
    act_ms = measure_expert_act_ms(seed=0, episodes=1, ticks=4)
    assert set(act_ms) == {"contact-free IK", "IK on the live model"}
    assert all(ms > 0 for ms in act_ms.values())
    result = {"image_size": [8, 8], "render_fps": {}, "render_fps_full": {}, "steps_per_s": 1.0,
              "physics_dt": 0.002, "realtime_factor": 0.002, "expert_success": {"push": 1.0},
              "expert_episode_s": {"push": 1.2}, "expert_act_ms": act_ms, "episodes_per_family": 1,
              "demo_recording": {
                  "sim in a child process": {"seconds": 30.0, "episodes": 24, "frames": 1800, "ms_per_frame": 16.7},
                  "one process": {"seconds": 48.0, "episodes": 24, "frames": 1800, "ms_per_frame": 26.7}}}
    print_table(result)
    out = capsys.readouterr().out
    assert "contact-free IK" in out and "the same commands" in out
    assert "1.60x" in out and "1.00x" in out  # each way's speed-up over one process
