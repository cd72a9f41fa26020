"""Local mode's parent process configures the replay from the algorithm's columns without
importing torch (about 1.5 s of start-up); the torch-free columns are the algorithm's own."""

import subprocess
import sys

import pytest

from apexrl import algorithms
from apexrl.config import AgentConfig

CASES = [
    ("dqn", "CartPole-v1"),
    ("dpg", "Pendulum-v1"),
    ("ppo", "CartPole-v1"),
    ("ppo", "Pendulum-v1"),
]


@pytest.mark.parametrize("algorithm,env", CASES)
def test_local_mode_signature_imports_no_torch(algorithm, env):
    code = (
        "import sys, apexrl.local.settings; from apexrl import config; "
        f"print(apexrl.local.settings.signature(config.AgentConfig(algorithm={algorithm!r}, env={env!r}))); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(("obs:float32:", "observations:float32:33x"))


@pytest.mark.parametrize(
    "algorithm,env",
    CASES
    + [("dpg", "MountainCarContinuous-v0"), ("dpg", "LunarLanderContinuous-v3")]
    + [("impala", "Acrobot-v1")],
)
def test_torch_free_columns_are_the_algorithms_own(algorithm, env):
    config = AgentConfig(algorithm=algorithm, env=env)
    assert algorithms.transition_columns(config) == algorithms.make(config).columns()


def test_lunar_lander_actions_are_two_float32_inside_their_bounds():
    """The harder continuous task (box2d, the `continuous` extra): 2-D actions in [-1, 1]."""
    config = AgentConfig(algorithm="dpg", env="LunarLanderContinuous-v3")
    action = {c.name: c for c in algorithms.transition_columns(config)}["action"]
    assert action.spec() == "action:float32:2:-1..1"


@pytest.mark.parametrize(
    "algorithm,env,message",
    [
        ("dqn", "Pendulum-v1", r"dqn needs a Discrete action space, Pendulum-v1"),
        ("dpg", "CartPole-v1", r"dpg needs a continuous \(Box\) action space, CartPole-v1"),
        (
            "a2c",
            "CartPole-v1",
            r"algorithm: 'a2c', expected one of \['a3c', 'dpg', 'dqn', 'impala', .*'ppo'.*\]",
        ),
    ],
)
def test_torch_free_columns_refuse_what_the_algorithm_refuses(algorithm, env, message):
    with pytest.raises(ValueError, match=message):
        algorithms.transition_columns(AgentConfig(algorithm=algorithm, env=env))
