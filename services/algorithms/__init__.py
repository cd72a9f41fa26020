"""The algorithm layer: a builder per algorithm (base.py says what one is) and what builders share.

Services (learner, actor, evaluator) import this layer; it imports neither them nor their
clients. Adding an algorithm: its folder, one line in ALGORITHMS, its tests; or, without
touching this package, `algorithm = "package.module:Builder"` in the config.

Importing this package and the builders costs no torch: local mode's parent process configures
the replay from the builders' tables without it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from apexrl.algorithms.envs import EnvOptions, env_spec
from apexrl.config import Algorithms
from apexrl.config_parsing import import_callable

if TYPE_CHECKING:
    from apexrl.algorithms.base import Builder
    from apexrl.algorithms.columns import Column

# name -> its Builder, as "module:attribute", imported on use (the registry costs nothing to read).
ALGORITHMS = {
    "dqn": "apexrl.algorithms.dqn.builder:DQNBuilder",
    "rainbow": "apexrl.algorithms.dqn.builder:RainbowBuilder",
    "dpg": "apexrl.algorithms.dpg.builder:DPGBuilder",
    "impala": "apexrl.algorithms.impala.builder:IMPALABuilder",
    "ppo": "apexrl.algorithms.ppo.builder:PPOBuilder",
    "nec": "apexrl.algorithms.nec.builder:NECBuilder",
    "unreal": "apexrl.algorithms.unreal.builder:UNREALBuilder",
    "r2d2": "apexrl.algorithms.r2d2.builder:R2D2Builder",
    "reinforce": "apexrl.algorithms.reinforce.builder:REINFORCEBuilder",
    "a3c": "apexrl.algorithms.a3c.builder:A3CBuilder",
}


def get(name: str) -> type[Builder]:
    """The builder registered as `name`, or imported from a "module:attribute" path (ValueError
    naming the setting otherwise)."""
    path = ALGORITHMS.get(name, name)
    if ":" not in path:
        raise ValueError(
            f"algorithm: {name!r}, expected one of {sorted(ALGORITHMS)} or 'module:Builder'"
        )
    from apexrl.algorithms.base import Builder

    found = import_callable(path, "algorithm")
    if not (isinstance(found, type) and issubclass(found, Builder)):
        raise ValueError(f"algorithm: {name!r} is not a Builder subclass")
    return found


def settings(name: str) -> tuple[str, type]:
    """(its config table's name, its Settings dataclass) of algorithm `name`."""
    builder = get(name)
    return builder.name, builder.Settings


REGISTRY = Algorithms(names=tuple(ALGORITHMS), settings=settings)


def make(config) -> Builder:
    """The builder of `config.algorithm` for `config.env`, with `config.algo` its settings."""
    return get(config.algorithm)(config, env_spec(config.env, EnvOptions.of(config)))


def transition_columns(config) -> list[Column]:
    """The columns of `config.algorithm`'s items on `config.env` (make(config).columns())."""
    return make(config).columns()


def set_torch_threads(threads: int) -> None:
    """torch's CPU threads, where a policy loaded torch (one acting in numpy does not)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
