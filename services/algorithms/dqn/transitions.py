"""DQN's transitions, torch-free (local mode's parent reads them to configure the replay)."""

import numpy as np

from apexrl.algorithms.columns import Column, nstep_columns
from apexrl.algorithms.envs import EnvSpec


def check_spaces(spec: EnvSpec) -> None:
    """DQN acts in Discrete action spaces only."""
    if not spec.discrete:
        raise ValueError(
            f"algorithm: dqn needs a Discrete action space, {spec.env_id} has a continuous"
            " one (use algorithm = dpg)"
        )


def columns(spec: EnvSpec, config=None) -> list[Column]:
    """n-step transitions whose actions are int64 indices."""
    check_spaces(spec)
    return nstep_columns(spec, np.dtype(np.int64))
