"""A checkpoint's joint order against a robot's: matched by name, LeRobot's ".pos" suffix aside."""

import numpy as np
import pytest
import torch

from robot_rl.core.errors import ConfigError
from robot_rl.policies.joint_order import JointOrder


def test_vectors_go_to_the_joint_of_the_same_name_and_back():
    order = JointOrder(["shoulder_pan.pos", "elbow_flex.pos", "gripper.pos"], ["gripper", "shoulder_pan", "elbow_flex"])
    robot_state = np.array([30.0, 1.0, 2.0])  # gripper, shoulder_pan, elbow_flex
    assert order.to_policy(robot_state).tolist() == [1.0, 2.0, 30.0]
    chunk = torch.tensor([[1.0, 2.0, 30.0], [3.0, 4.0, 40.0]])  # [T, J] in the policy's order
    assert order.to_robot(chunk).tolist() == [[30.0, 1.0, 2.0], [40.0, 3.0, 4.0]]
    assert np.array_equal(order.to_robot(order.to_policy(robot_state)), robot_state)
    assert not order.is_identity and JointOrder(["a", "b"], ["a.pos", "b"]).is_identity


@pytest.mark.parametrize(("policy", "robot", "message"), [
    (["a", "b"], ["a", "c"], r"the robot lacks \['b'\]; the policy lacks \['c'\]"),
    (["a", "a.pos"], ["a", "b"], "each once"),
    (["a"], ["a", "b"], r"the policy lacks \['b'\]"),
])
def test_joints_that_do_not_pair_up_are_refused_naming_them(policy, robot, message):
    with pytest.raises(ConfigError, match=message):
        JointOrder(policy, robot)


@pytest.mark.parametrize("names", [["a.pos", "b.pos"], {"motors": ["a.pos", "b.pos"]}])
def test_a_datasets_joint_names_are_read_in_its_order_in_either_of_lerobots_forms(tmp_path, names):
    import json

    from robot_rl.data.reader import recorded_joint_names

    (tmp_path / "meta").mkdir()
    features = {"observation.state": {"dtype": "float32", "shape": [2], "names": names}}
    (tmp_path / "meta" / "info.json").write_text(json.dumps({"features": features}))
    assert recorded_joint_names(tmp_path) == ("a.pos", "b.pos")
