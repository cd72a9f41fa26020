"""Acting without torch: the policies of MLP networks on vector observations, in numpy, on the
arrays the learner publishes (networks.state_to_numpy's names).

Actors and evaluators of such policies never import torch, which costs each process about
1.4 CPU seconds of start-up, several times what acting on CartPole costs in a minute. The
learner trains the torch modules these mirror: dqn's dueling MLP (dqn/networks.py, without
noisy or C51 heads) and the actor-critic MLPs of impala and ppo (actor_critic.py);
tests/unit/test_numpy_policies.py checks that both give the same actions, log-probabilities,
values and priorities on the same weights.
"""

from collections.abc import Callable, Mapping

import numpy as np

from apexrl.algorithms.base import Policy
from apexrl.algorithms.exploration import epsilon_greedy

Arrays = Mapping[str, np.ndarray]
SDE_EPSILON = 1e-6  # gaussian.py's


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def linear(arrays: Arrays, name: str, x: np.ndarray) -> np.ndarray:
    """torch.nn.Linear named `name`: x W^T + b."""
    return x @ arrays[f"{name}.weight"].T + arrays[f"{name}.bias"]


def mlp(arrays: Arrays, name: str, obs: np.ndarray, activation: Callable = relu) -> np.ndarray:
    """networks.MLPTorso named `name` (Linear and activation pairs under `name`.layers.<i>) on
    observations cast to float32."""
    x = np.asarray(obs, np.float32)
    layer = 0
    while f"{name}.layers.{layer}.weight" in arrays:
        x = activation(linear(arrays, f"{name}.layers.{layer}", x))
        layer += 2
    return x


def mlp_names(name: str, depth: int) -> set[str]:
    return {f"{name}.layers.{2 * i}.{p}" for i in range(depth) for p in ("weight", "bias")}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def draw(log_probs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """An action per row of log-probabilities [B, A], drawn with the actor's generator, and
    its log-probability, float32 [B]."""
    cumulative = np.cumsum(np.exp(log_probs), axis=1)
    draws = rng.random(len(log_probs)) * cumulative[:, -1]
    actions = np.minimum((cumulative < draws[:, None]).sum(1), log_probs.shape[1] - 1)
    return actions, log_probs[np.arange(len(log_probs)), actions].astype(np.float32)


class NumpyPolicy(Policy):
    """Holds the published arrays it acts with, refusing a set that lacks one (others, such as
    the auxiliary heads of unreal's network, are not needed to act and are left out)."""

    def __init__(self, names: set[str]):
        self.names = names
        self.arrays: dict[str, np.ndarray] = {}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        missing = sorted(self.names - set(arrays))
        if missing:
            raise ValueError(f"weight names differ: missing {missing}")
        self.arrays = {name: np.asarray(arrays[name], np.float32) for name in self.names}


class MLPQPolicy(NumpyPolicy):
    """dqn's DQNPolicy for a dueling MLP: epsilon-greedy on Q = V + A - mean(A)."""

    def __init__(self, num_actions: int, depth: int):
        heads = {f"{head}.{p}" for head in ("value", "advantage") for p in ("weight", "bias")}
        super().__init__(mlp_names("torso", depth) | heads)
        self.num_actions = num_actions

    def q(self, obs: np.ndarray) -> np.ndarray:
        features = mlp(self.arrays, "torso", obs)
        value = linear(self.arrays, "value", features)
        advantage = linear(self.arrays, "advantage", features)
        return value + advantage - advantage.mean(axis=1, keepdims=True)

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        return epsilon_greedy(self.q(obs).argmax(1), exploration, self.num_actions, rng)

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """|TD error| of the double-DQN target with the actor's network as online and target
        (Ape-X): y = reward + discount * max_a Q(next_obs, a)."""
        target = items["reward"] + items["discount"] * self.q(items["next_obs"]).max(1)
        q = self.q(items["obs"])[np.arange(len(target)), items["action"]]
        return np.abs(target - q).astype(np.float32)


class ActionHead:
    """How a policy's output becomes actions; a head that keeps noise across steps (gSDE)
    hears of the actor's episode starts and kept envs as the policy does (base.Policy)."""

    names: tuple[str, ...] = ()

    def output(self, arrays: Arrays, features: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sample(self, out: np.ndarray, rng: np.random.Generator):
        raise NotImplementedError

    def mode(self, out: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def episode_starts(self, starts: np.ndarray) -> None:
        """Stateless: nothing."""

    def keep_envs(self, envs: np.ndarray) -> None:
        """Stateless: nothing."""


class Softmax(ActionHead):
    """How a softmax policy's logits [B, A] become actions: sampled, or the most likely."""

    names = ("logits.weight", "logits.bias")

    def output(self, arrays: Arrays, features: np.ndarray) -> np.ndarray:
        return linear(arrays, "logits", features)

    def sample(self, logits: np.ndarray, rng: np.random.Generator):
        actions, log_probs = draw(log_softmax(logits), rng)
        return actions, {"log_probs": log_probs}

    def mode(self, logits: np.ndarray) -> np.ndarray:
        return logits.argmax(1)


def gaussian_log_probs(noise: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """log N(mean + noise; mean, exp(log_std)) summed over the dimensions, float32 [B]."""
    z = noise * np.exp(-log_std)
    return (-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(1).astype(np.float32)


class ClippedGaussian(ActionHead):
    """How a diagonal Gaussian's output [B, 2 * dims] (mean, log-std: gaussian.py) becomes
    actions: a sample clipped to [low, high] for the env, its unclipped value
    ("sampled_actions") and log-probability recorded for the learner; evaluation plays the
    clipped mean."""

    names = ("gaussian.mean.weight", "gaussian.mean.bias", "gaussian.log_std")

    def __init__(self, low: np.ndarray, high: np.ndarray):
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.dims = self.low.size

    def output(self, arrays: Arrays, features: np.ndarray) -> np.ndarray:
        mean = linear(arrays, "gaussian.mean", features)
        return np.concatenate([mean, np.broadcast_to(arrays["gaussian.log_std"], mean.shape)], 1)

    def sample(self, out: np.ndarray, rng: np.random.Generator):
        mean, log_std = out[:, : self.dims], out[:, self.dims : 2 * self.dims]
        noise = (np.exp(log_std) * rng.standard_normal(mean.shape)).astype(np.float32)
        return self.clipped(mean, noise, log_std)

    def clipped(self, mean: np.ndarray, noise: np.ndarray, log_std: np.ndarray):
        """The env's actions and the adder's extras of the sample mean + noise."""
        samples = (mean + noise).astype(np.float32)
        extras = {"log_probs": gaussian_log_probs(noise, log_std), "sampled_actions": samples}
        return np.clip(samples, self.low, self.high), extras

    def mode(self, out: np.ndarray) -> np.ndarray:
        return np.clip(out[:, : self.dims], self.low, self.high).astype(np.float32)


class StateDependentGaussian(ClippedGaussian):
    """gSDE (gaussian.StateDependentHead): the noise is phi(s) . W_e, W_e = sigma * Z_e with
    Z_e [features, dims] standard normal per env e, drawn again every `sample_freq` steps of
    that env and at its episode's start (SB3 draws all envs' at once every sde_sample_freq
    steps and at each rollout's start). W is made of the sigma of the arrays the noise is
    applied with, so the recorded log-probability, at the state's std sqrt(phi^2 . sigma^2),
    is always the sample's. Output [B, 2 * dims + features]: mean, log-std, phi."""

    def __init__(self, low: np.ndarray, high: np.ndarray, sample_freq: int):
        super().__init__(low, high)
        self.sample_freq = sample_freq
        self.sigma = np.ones((0, self.dims), np.float32)
        self.z = np.zeros((0, 0, self.dims), np.float32)  # per env [B, features, dims]
        self.age = np.zeros(0, np.int64)  # steps each env's Z has acted; sample_freq: due

    def output(self, arrays: Arrays, features: np.ndarray) -> np.ndarray:
        self.sigma = np.exp(arrays["gaussian.log_std"])
        mean = linear(arrays, "gaussian.mean", features)
        log_std = 0.5 * np.log((features**2) @ self.sigma**2 + SDE_EPSILON)
        return np.concatenate([mean, log_std, features], 1).astype(np.float32)

    def sample(self, out: np.ndarray, rng: np.random.Generator):
        mean, log_std = out[:, : self.dims], out[:, self.dims : 2 * self.dims]
        phi = out[:, 2 * self.dims :]
        if self.z.shape[:2] != phi.shape:
            self.episode_starts(np.ones(len(phi), bool))
            self.z = np.zeros((*phi.shape, self.dims), np.float32)
        due = self.age >= self.sample_freq
        self.z[due] = rng.standard_normal((int(due.sum()), *self.z.shape[1:]))
        self.age[due] = 0
        self.age += 1
        noise = np.einsum("bf,bfd->bd", phi, self.z * self.sigma).astype(np.float32)
        return self.clipped(mean, noise, log_std)

    def episode_starts(self, starts: np.ndarray) -> None:
        if len(starts) != len(self.age):
            self.age = np.zeros(len(starts), np.int64)
            self.z = np.zeros((0, 0, self.dims), np.float32)
        self.age[starts] = self.sample_freq

    def keep_envs(self, envs: np.ndarray) -> None:
        self.age = self.age[envs]
        if len(self.z):
            self.z = self.z[envs]


OBS_NORM = ("obs_norm.mean", "obs_norm.var", "obs_norm.count")
RETURN_NORM = ("return_norm.mean", "return_norm.var", "return_norm.count")
NORM_EPSILON, NORM_CLIP = 1e-8, 10.0  # normalizer.py's


class MLPActorCriticPolicy(NumpyPolicy):
    """impala's and ppo's ActorCriticPolicy for tanh MLP torsos: actors sample the policy and
    record the log-probabilities; evaluation takes the most likely action. With the running
    statistics of normalizer.py (obs_norm, return_norm) when the network keeps them."""

    def __init__(
        self,
        depth: int,
        actions: ActionHead | None = None,
        *,
        normalize_obs: bool = False,
        normalize_returns: bool = False,
    ):
        self.actions = actions or Softmax()
        value = {"value.weight", "value.bias"}
        norms = OBS_NORM * normalize_obs + RETURN_NORM * normalize_returns
        torsos = mlp_names("policy_torso", depth) | mlp_names("value_torso", depth)
        super().__init__(torsos | value | set(self.actions.names) | set(norms))
        self.normalize_obs, self.normalize_returns = normalize_obs, normalize_returns

    def normalized(self, obs: np.ndarray) -> np.ndarray:
        if not self.normalize_obs:
            return obs
        mean, var = self.arrays["obs_norm.mean"], self.arrays["obs_norm.var"]
        return np.clip((obs - mean) / np.sqrt(var + NORM_EPSILON), -NORM_CLIP, NORM_CLIP)

    def head(self, obs: np.ndarray) -> np.ndarray:
        features = mlp(self.arrays, "policy_torso", self.normalized(obs), np.tanh)
        return self.actions.output(self.arrays, features)

    def log_probs(self, obs: np.ndarray) -> np.ndarray:
        """The softmax policy's log-probabilities [B, A]."""
        return log_softmax(self.head(obs))

    def act(self, obs: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
        if exploration > 0:
            return self.step(obs, exploration, rng)[0]
        return self.actions.mode(self.head(obs))

    def step(self, obs, exploration, rng):
        return self.actions.sample(self.head(obs), rng)

    def episode_starts(self, starts: np.ndarray) -> None:
        self.actions.episode_starts(starts)

    def keep_envs(self, envs: np.ndarray) -> None:
        self.actions.keep_envs(envs)

    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) [B] in the env's reward units (an actor bootstraps a truncated episode's last
        reward with it)."""
        features = mlp(self.arrays, "value_torso", self.normalized(obs), np.tanh)
        values = linear(self.arrays, "value", features)[:, 0]
        if self.normalize_returns:
            values = values * np.sqrt(self.arrays["return_norm.var"] + NORM_EPSILON)
        return values

    def priorities(self, items: dict[str, np.ndarray]) -> np.ndarray:
        """Unrolls are consumed in order, not by priority: all 1."""
        return np.ones(len(items["actions"]), np.float32)
