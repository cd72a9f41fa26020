"""DPG's transitions, torch-free (local mode's parent reads them to configure the replay)."""

import numpy as np

from apexrl.algorithms.columns import Column, nstep_columns
from apexrl.algorithms.envs import EnvSpec


def check_spaces(spec: EnvSpec) -> None:
    """DPG acts in continuous (Box) action spaces only."""
    if spec.discrete:
        raise ValueError(
            f"algorithm: dpg needs a continuous (Box) action space, {spec.env_id} has a"
            f" Discrete one with {spec.num_actions} actions (use algorithm = dqn)"
        )


def columns(spec: EnvSpec, config=None) -> list[Column]:
    """n-step transitions whose actions are float32 of the env's action shape, inside its
    bounds."""
    check_spaces(spec)
    return nstep_columns(spec, np.dtype(np.float32))
