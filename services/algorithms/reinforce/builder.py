"""REINFORCE's builder (Williams 1992): Monte Carlo policy gradient on whole episodes.

Actors sample their policy and write each episode as one item (adders/episode.py) to a queue
table; the learner gathers `batch_size` episodes acted by its current version (older ones are
dropped and counted: the gradient is on-policy), takes one gradient step and publishes the
next version. Actors take a new version whenever it arrives, pulling after each episode.

Returns and the loss are in losses.py: discounted returns G_t of each episode, bootstrapped
where it was truncated if there is a baseline; the advantage is G_t normalised over the
batch's steps (baseline "none"), or G_t - V(s_t) normalised so (baseline "value", a value
network regressed on G_t).
"""

import dataclasses
from dataclasses import dataclass

from apexrl.algorithms.adders.episode import EpisodeAdder, episode_columns
from apexrl.algorithms.base import Adder, ParameterSync, Policy
from apexrl.algorithms.columns import Column
from apexrl.algorithms.on_policy import OnPolicyBuilder
from apexrl.algorithms.tables import TABLE, QueueTable
from apexrl.config import option

BASELINES = ("none", "value")


@dataclass
class Settings(QueueTable):
    """[reinforce]: REINFORCE's settings (`capacity`: the episodes its queue holds)."""

    max_episode_steps: int = option(
        500,
        "steps an item holds (CartPole-v1's time limit): a longer episode is cut into items"
        " of at most this many steps, each cut ending as a truncation",
    )
    baseline: str = option(
        "value",
        "none (advantage: the return, normalised per batch) or value (a value network regressed"
        " on the returns; advantage: return - V(s), normalised per batch; bootstraps truncations)",
    )
    normalize: bool = option(True, "advantages scaled to mean 0, std 1 over the batch's steps")
    value_cost: float = option(0.5, "weight of the value (baseline) loss")
    entropy_cost: float = option(0.0, "weight of the entropy bonus")
    optimizer: str = option("adam", "adam or rmsprop (decay 0.99, no momentum)")
    optimizer_eps: float = option(
        1e-5, "the optimizer's epsilon, added to the root of its second moment"
    )


class REINFORCEBuilder(OnPolicyBuilder):
    name = "reinforce"
    Settings = Settings
    # After each episode the actor asks for the newest version, acting on while it comes.
    parameter_sync = ParameterSync(periodic=False)
    learning_class = "apexrl.algorithms.reinforce.learning:REINFORCELearning"
    metrics = dataclasses.replace(
        OnPolicyBuilder.metrics,
        loss_help="REINFORCE loss (policy, value and entropy terms) of the last update.",
        figures={
            "value_mean": "Mean state value V(s) over the last batch's steps (0: no baseline).",
            "policy_loss": "Policy-gradient loss of the last update.",
            "value_loss": "Value (baseline) loss of the last update (0: no baseline).",
            "entropy": "Mean policy entropy over the last batch's steps.",
            "return_mean": "Mean discounted return G_t over the last batch's steps.",
            "episode_steps": "Mean steps per item of the last batch.",
        },
    )

    @classmethod
    def presets(cls, env_id: str) -> dict:
        """Local mode: 2 actors x 4 envs, 16 episodes a batch, Adam at 2e-3."""
        return cls.small_machine(env_id, {"batch_size": 16})

    def check(self) -> None:
        super().check()  # action space, max_episode_steps, optimizer, costs, capacity
        s = self.settings
        if s.baseline not in BASELINES:
            raise ValueError(f"baseline: must be one of {', '.join(BASELINES)}, got {s.baseline!r}")

    def check_policy(self) -> None:
        """A softmax policy only, without normalizers: columns() refuses Box actions."""

    def network_options(self) -> dict:
        return {}

    def normalizers(self) -> dict:
        return {}

    def columns(self) -> list[Column]:
        return episode_columns(self.spec, self.settings.max_episode_steps, self.name)

    def adders(self, num_envs: int, policy: Policy) -> list[Adder]:
        spec = self.spec
        steps = self.settings.max_episode_steps
        return [EpisodeAdder(num_envs, steps, spec.obs_shape, spec.obs_dtype, self.config.gamma)]

    def dataset(self):
        from apexrl.algorithms.datasets import FreshQueue

        return FreshQueue(TABLE)
