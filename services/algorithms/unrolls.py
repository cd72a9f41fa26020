"""The columns of impala's and ppo's unrolls, torch-free (local mode's parent reads them to
configure the replay)."""

from apexrl.algorithms.columns import Column, unroll_columns
from apexrl.algorithms.envs import EnvSpec


def columns(spec: EnvSpec, config) -> list[Column]:
    """Unrolls of `config.unroll_length` steps (algorithms/columns.py documents them)."""
    return unroll_columns(spec, config.unroll_length)
