"""The algorithm layer: networks, update steps, policies and transition columns per algorithm.

Services (learner, actor, evaluator) import this layer; it imports neither them nor their
clients. Adding an algorithm: its folder, one line in ALGORITHMS, its tests.
"""

import importlib

from apexrl.algorithms.base import Algorithm
from apexrl.algorithms.envs import env_spec

# name -> "module:class", imported on use (the registry costs nothing to read).
ALGORITHMS = {
    "dqn": "apexrl.algorithms.dqn.algorithm:DQN",
    "dpg": "apexrl.algorithms.dpg.algorithm:DPG",
}


def get(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name` (ValueError naming the setting otherwise)."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: {name!r}, expected one of {sorted(ALGORITHMS)}")
    module, cls = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make(config) -> Algorithm:
    """The algorithm `config.algorithm` for `config.env`."""
    return get(config.algorithm)(config, env_spec(config.env))
