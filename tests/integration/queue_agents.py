"""What the on-policy service tests share: local mode's config file for an agent (its queue
table as the builder makes it), the mean return of its sampled policy, and a learner that
refuses a setting at start-up."""

import subprocess
import sys

from apexrl.algorithms.evaluation import evaluate
from apexrl.config import AgentConfig
from apexrl.local.settings import dump_toml, replay_tables

SEEDS = 1_000  # the evaluation episodes' first seed


def config_file(tmp_path, agent: AgentConfig) -> str:
    """What local mode writes: the agent's settings and the builder's queue table."""
    path = tmp_path / "apexrl.toml"
    data = {
        "algorithm": agent.algorithm,
        "env": agent.env,
        "replay": {"tables": replay_tables(agent, 1)},
    }
    path.write_text(dump_toml(data))
    return str(path)


def sampled_return(policy, arrays, env: str) -> float:
    """The mean return of 10 episodes of the sampled policy with these parameters."""
    policy.load(arrays)
    return float(evaluate(policy, env, 10, SEEDS, exploration=1.0).mean())


def learner_refusal(tmp_path, agent: AgentConfig, *flags: str) -> str:
    """A learner started with the agent's config and `flags` must stop at start-up with exit
    status 2 and no traceback; its stderr."""
    started = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "learner", "--config", config_file(tmp_path, agent),
         *flags, "--replay", "127.0.0.1:1", "--port", "0", "--metrics-port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 2, started.stderr
    assert "Traceback" not in started.stderr
    return started.stderr
