"""What the on-policy service tests share: local mode's config file for an agent (its queue
table as the builder makes it) and the mean return of its sampled policy."""

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
