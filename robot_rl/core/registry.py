"""Named choices of one kind of component: robots, teleop devices, policies, learning algorithms.

A component is chosen on the command line by name (``robot=so101``, ``teleop=leader``,
``learner/algorithm=rwr``). Each name stands for a config dataclass, stored in Hydra's
ConfigStore under the kind's group, so that choosing it types and checks every one of its
fields; the registry also remembers what to build from a config of that class. Builders are
named by a dotted path (``"robot_rl.hardware.sim.robot:SimSO101"``, or ``"module:Class.method"``)
and imported only when one is built: choosing a robot never imports another robot's drivers,
and an edge PC without MuJoCo can still read a config that names the sim.

The product never branches on a component's name: ``ROBOTS.build(config)`` finds the builder by
the config's class.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from hydra.core.config_store import ConfigStore


class Registry[T]:
    """The choices of one kind, e.g. ``Registry("robot", group="robot")``.

    ``group`` is the Hydra config group the names live in (``learner/algorithm`` for a nested one).
    """

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group
        self._classes: dict[str, type] = {}
        self._builders: dict[type, str] = {}

    def register[ConfigClass: type](self, name: str, builder: str) -> Callable[[ConfigClass], ConfigClass]:
        """Class decorator: ``name`` selects this config dataclass; ``builder`` ("module:attr.attr") is
        called with the config (and whatever ``build`` is given) to make the component."""
        if ":" not in builder:
            raise ValueError(f"{self.kind} builder {builder!r} must be 'module:attribute'")

        def decorate(cls: ConfigClass) -> ConfigClass:
            known = self._classes.get(name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise ValueError(f"{self.kind} {name!r} is registered twice: "
                                 f"{known.__qualname__} and {cls.__qualname__}")
            self._classes[name] = cls
            self._builders[cls] = builder
            ConfigStore.instance().store(group=self.group, name=name, node=cls)
            return cls

        return decorate

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._classes))

    def name_of(self, config: object) -> str:
        """The registered name of ``config``'s class (or of its nearest registered base class)."""
        for cls in type(config).__mro__:
            for name, registered in self._classes.items():
                if registered is cls:
                    return name
        raise TypeError(f"{type(config).__name__} is not a registered {self.kind} config; "
                        f"registered: {', '.join(self.names())}")

    def build(self, config: object, *args: Any, **kwargs: Any) -> T:
        """The component ``config`` describes: its builder called with ``(config, *args, **kwargs)``."""
        builder = self._builders[self._classes[self.name_of(config)]]
        module_name, _, attribute = builder.partition(":")
        target: Any = importlib.import_module(module_name)
        for name in attribute.split("."):
            target = getattr(target, name)
        return target(config, *args, **kwargs)


# The kinds that hardware/, bridges/ and policies/ register into (they import only robot_rl.core).
ROBOTS: Registry[Any] = Registry("robot", group="robot")
TELEOPS: Registry[Any] = Registry("teleop device", group="teleop")
POLICIES: Registry[Any] = Registry("policy", group="policy")
VIEWERS: Registry[Any] = Registry("viewer", group="viewer")
