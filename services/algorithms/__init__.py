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


def make(config) -> Algorithm:
    """The algorithm `config.algorithm` for `config.env` (ValueError naming what is wrong)."""
    if config.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: {config.algorithm!r}, expected one of {sorted(ALGORITHMS)}")
    module, name = ALGORITHMS[config.algorithm].split(":")
    return getattr(importlib.import_module(module), name)(config, env_spec(config.env))
