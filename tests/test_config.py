"""The typed configuration: strict composition, one place per default, and what the CLI says about it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from robot_rl import cli
from robot_rl.config import CONFIG_DIR, ConfigError, RobotRLConfig, load_config, register_configs

CONFIG_COMMANDS = [name for name, (module, _) in cli.SUBCOMMANDS.items() if name not in ("keys", "bench")]


# ---------------------------------------------------------------- strict composition


def test_the_defaults_compose_into_dataclasses():
    from robot_rl.hardware.sim.config import SimConfig
    from robot_rl.policies.flow_vla.config import FlowVLAPolicyConfig

    cfg = load_config([])
    assert isinstance(cfg, RobotRLConfig)
    assert isinstance(cfg.robot, SimConfig) and isinstance(cfg.policy, FlowVLAPolicyConfig)
    assert cfg.edge.fps == cfg.robot.fps  # wired in configs/config.yaml


def test_a_setting_of_one_group_follows_into_the_groups_wired_to_it():
    cfg = load_config(["robot.fps=15"])
    assert cfg.robot.fps == cfg.edge.fps == 15


@pytest.mark.parametrize("override, names", [
    ("robot.fpss=15", ["robot.fpss", "fps", "did you mean robot.fps?"]),
    ("episodes=3", ["episodes is not a setting", "session.episodes"]),
    ("+episodes=3", ["episodes is not a setting"]),  # Hydra's own hint: appending must not sneak a key in
    ("+run.speed=3", ["run.speed is not a setting", "episodes"]),
    ("learner=rwr learner.algorithm.betta=1",
     ["learner.algorithm.betta", "beta", "did you mean learner.algorithm.beta?"]),
])
def test_a_misspelled_setting_is_refused_naming_the_valid_ones(override, names):
    with pytest.raises(ConfigError) as error:
        load_config(override.split())
    message = str(error.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_a_new_key_in_a_dict_setting_says_to_add_it_with_a_plus():
    with pytest.raises(ConfigError) as error:
        load_config(["robot=ros2_arm", "robot.cameras={front:{topic:/image}}"])
    assert str(error.value).endswith("+robot.cameras={front:{topic:/image}}") and "\n" not in str(error.value)
    cfg = load_config(["robot=ros2_arm", "+robot.cameras={front:{topic:/image}}"])
    assert cfg.robot.cameras == {"front": {"topic": "/image"}}


@pytest.mark.parametrize("override, needle", [
    ("robot.fps=fast", "robot.fps"),
    ("run.robots=fibers", "expected one of [process, thread]"),
    ("task_families=push", "task_families"),
    ("robot=nope", "choose one of"),
])
def test_a_wrong_value_is_refused_in_one_line(override, needle):
    with pytest.raises(ConfigError) as error:
        load_config([override])
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_a_learner_address_in_the_algorithm_group_points_to_link_learner():
    with pytest.raises(ConfigError, match="link.learner=tcp://10.0.0.2:5555"):
        load_config(["learner=tcp://10.0.0.2:5555"])
    assert load_config(["link.learner=tcp://10.0.0.2:5555"]).link.weights_endpoint() == "tcp://10.0.0.2:5556"


def test_choices_are_chosen_by_name_and_built_by_their_registry():
    from robot_rl.core.registry import ROBOTS, TELEOPS
    from robot_rl.hardware.lerobot_robot_config import LeRobotRobotConfig
    from robot_rl.hardware.teleop.leader import LeaderArmConfig

    cfg = load_config(["robot=so101", "teleop=leader", "teleop.port=/dev/ttyUSB1"])
    assert isinstance(cfg.robot, LeRobotRobotConfig) and cfg.robot.cameras["front"]["type"] == "opencv"
    assert isinstance(cfg.teleop, LeaderArmConfig) and cfg.teleop.port == "/dev/ttyUSB1"
    assert ROBOTS.name_of(cfg.robot) == "lerobot" and TELEOPS.name_of(cfg.teleop) == "leader"


def test_a_registry_refuses_a_config_it_does_not_know():
    from robot_rl.core.registry import ROBOTS

    with pytest.raises(TypeError, match="not a registered robot"):
        ROBOTS.build(object())


# ---------------------------------------------------------------- one place per default


def _yaml_files() -> list[Path]:
    return sorted(p for p in CONFIG_DIR.rglob("*.yaml"))


def _stored_or_preset(config_path: str) -> DictConfig:
    """A stored config (ConfigStore) or a YAML preset in configs/, as it composes."""
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.config_source import ConfigLoadError

    try:
        return ConfigStore.instance().load(config_path).node
    except ConfigLoadError:
        preset = CONFIG_DIR / config_path
        body = {k: v for k, v in (yaml.safe_load(preset.read_text()) or {}).items() if k != "defaults"}
        return OmegaConf.merge(_schema_for(preset), body)


def _schema_for(path: Path) -> DictConfig:
    """What a YAML file starts from: the configs its defaults list names, merged."""
    register_configs()
    group = path.parent.relative_to(CONFIG_DIR).as_posix()
    prefix = "" if group == "." else f"{group}/"
    data = yaml.safe_load(path.read_text()) or {}
    base = OmegaConf.create({})
    for entry in data.get("defaults", []):
        if entry == "_self_":
            continue
        if isinstance(entry, str):
            base = OmegaConf.merge(base, _stored_or_preset(f"{prefix}{entry}.yaml"))
        else:
            ((sub_group, option),) = entry.items()
            OmegaConf.set_struct(base, False)
            base[sub_group] = _stored_or_preset(f"{prefix}{sub_group}/{option}.yaml")
    return base


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() if key != "defaults"
                for leaf in _leaves(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), node)]


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: p.relative_to(CONFIG_DIR).as_posix())
def test_no_yaml_value_repeats_its_dataclass_default(path):
    """YAML holds presets and deltas: a value equal to the dataclass default is a second copy of it,
    which drifts the day one of the two changes."""
    schema = _schema_for(path)
    data = yaml.safe_load(path.read_text()) or {}
    repeated = []
    for key, value in _leaves(data):
        default = OmegaConf.select(schema, key, throw_on_missing=False, default="<absent>")
        if isinstance(default, (DictConfig,)) or default == "<absent>":
            continue
        plain = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
        if plain == value:
            repeated.append(f"{key}: {value!r}")
    assert not repeated, f"{path.name} repeats dataclass defaults: {repeated}"


def test_every_preset_composes():
    for path in _yaml_files():
        group = path.parent.relative_to(CONFIG_DIR).as_posix()
        if group == ".":
            continue
        prefix = "+" if group == "bench" else ""
        load_config([f"{prefix}{group}={path.stem}"])


def test_every_dataclass_field_of_the_root_has_a_comment_or_a_docstring():
    """A setting says what it is where it is defined: --help and --cfg job show the names only."""
    import inspect

    source = inspect.getsource(RobotRLConfig)
    for field in dataclasses.fields(RobotRLConfig):
        line = next(line for line in source.splitlines() if line.strip().startswith(f"{field.name}:"))
        assert "#" in line or field.name == "task_families", field.name


# ---------------------------------------------------------------- the command line


def exit_code(argv: list[str]) -> int:
    """``robot-rl ARGV``'s exit code, in this process (argparse commands exit through SystemExit)."""
    try:
        return cli.main(argv)
    except SystemExit as done:
        return int(done.code or 0)


@pytest.mark.parametrize("command", [*cli.SUBCOMMANDS])
def test_every_command_answers_help(command, capsys):
    assert exit_code([command, "--help"]) == 0
    assert f"robot-rl {command}" in capsys.readouterr().out


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
def test_help_lists_the_groups_the_command_reads(command, capsys):
    import importlib

    module = importlib.import_module(f"robot_rl.commands.{cli.SUBCOMMANDS[command][0]}")
    assert cli.main([command, "-h"]) == 0
    out = capsys.readouterr().out
    for group in module.GROUPS:
        assert f"  {group}" in out, group


def test_cfg_job_prints_the_composed_config(capsys):
    assert cli.main(["run", "--cfg", "job", "run.episodes=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["run"]["episodes"] == 7 and printed["edge"]["fps"] == "${robot.fps}"
    assert cli.main(["run", "--cfg", "job", "--resolve", "robot.fps=20"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["edge"]["fps"] == 20


def test_info_names_the_option_each_group_got(capsys):
    assert cli.main(["session", "--info", "robot=so101", "teleop=leader"]) == 0
    out = capsys.readouterr().out
    assert "robot" in out and "so101" in out and "leader" in out


@pytest.mark.parametrize("command, override, needle", [
    ("run", "run.episodez=3", "run.episodez is not a setting"),
    ("run", "robot.fps=fast", "robot.fps"),
    ("demo-sim", "+episodes=3", "demo_sim.episodes"),
    ("eval", "eval.episodes=many", "eval.episodes"),
])
def test_a_bad_override_is_one_line_and_exit_2(command, override, needle, capsys):
    assert cli.main([command, override]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith(f"robot-rl {command}: ")


def test_a_learner_off_loopback_without_keys_is_one_line_and_exit_2(tmp_path, capsys):
    from tests.learner_helpers import tiny_policy

    tiny_policy().save_pretrained(tmp_path / "policy")
    assert cli.main(["learner", f"policy.path={tmp_path / 'policy'}", f"output_dir={tmp_path / 'out'}",
                     "learner.service.router_endpoint=tcp://0.0.0.0:0", "learner.trainer.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("robot-rl learner: ") and "CURVE keys are required" in err and "Traceback" not in err
