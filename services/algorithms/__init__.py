"""The algorithm layer: networks, update steps, policies and transition columns per algorithm.

Services (learner, actor, evaluator) import this layer; it imports neither them nor their
clients. Adding an algorithm: its folder, one line in ALGORITHMS, its tests.

Importing this package costs no torch: `columns` answers from each algorithm's torch-free
transitions module, so local mode's parent process configures the replay without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from apexrl.algorithms.envs import EnvOptions, env_spec

if TYPE_CHECKING:
    from apexrl.algorithms.base import Algorithm
    from apexrl.algorithms.columns import Column

# name -> (its Algorithm class, its torch-free columns function), as "module:attribute",
# imported on use (the registry costs nothing to read).
ALGORITHMS = {
    "dqn": ("apexrl.algorithms.dqn.algorithm:DQN", "apexrl.algorithms.dqn.transitions:columns"),
    "dpg": ("apexrl.algorithms.dpg.algorithm:DPG", "apexrl.algorithms.dpg.transitions:columns"),
    "impala": ("apexrl.algorithms.impala.algorithm:IMPALA", "apexrl.algorithms.unrolls:columns"),
    "ppo": ("apexrl.algorithms.ppo.algorithm:PPO", "apexrl.algorithms.unrolls:columns"),
}


def _load(name: str, which: int):
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: {name!r}, expected one of {sorted(ALGORITHMS)}")
    module, attribute = ALGORITHMS[name][which].split(":")
    return getattr(importlib.import_module(module), attribute)


def get(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name` (ValueError naming the setting otherwise)."""
    return _load(name, 0)


def make(config) -> Algorithm:
    """The algorithm `config.algorithm` for `config.env`."""
    return get(config.algorithm)(config, env_spec(config.env, EnvOptions.of(config)))


def transition_columns(config) -> list[Column]:
    """The columns of `config.algorithm`'s transitions on `config.env`, without torch (the same
    as make(config).columns(); ValueError for an env whose action space it cannot act in)."""
    return _load(config.algorithm, 1)(env_spec(config.env, EnvOptions.of(config)), config)
