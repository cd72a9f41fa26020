"""Env construction, written once for actors, the evaluator and `apexrl eval`.

`env_spec` tells an algorithm what it acts on (observation and action spaces);
`make_vector_env` builds the vector env the actor steps, set up the way NStepAdder expects.

We use gymnasium's SAME_STEP autoreset. Under the default NEXT_STEP mode the
step after an episode end only resets that env (its action is ignored, reward
0), so the actor would have to recognise and skip those fake steps. Under
SAME_STEP every step is a real transition: an env whose episode ends is reset
within the same step, the returned obs is already the new episode's first obs,
and the final obs of the old episode is in infos["final_obs"] (an object array,
None for envs that did not end; mask infos["_final_obs"]).

Actor loop:

    envs, obs = make_vector_env(env_id, num_envs, seed)
    while True:
        actions = ...                                   # policy on obs
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        batch = adder.add(obs, actions, rewards, terminated, truncated,
                          final_observations(next_obs, infos))
        obs = next_obs                                  # reset obs where an episode ended

Atari (any `ALE/...` id, ale-py ships the ROMs): the standard DQN preprocessing with
gymnasium's own wrappers, as Machado et al. (2018, "Revisiting the ALE") evaluate it, which
is also ALE v5's default: sticky actions (p = 0.25), the minimal action set, episodes of at
most 108,000 frames; and as Mnih et al. (2015): up to 30 no-op starts, frame skip 4 with the
max of the last two frames, 84x84 grayscale, a stack of the last 4 frames. Observations are
uint8 [4, 84, 84] (stack first, as the CNN reads them). In games with lives and a FIRE action
(Breakout) FIRE is pressed at the start and after each life lost (FireToStart). Rewards stay
the game's: the actor clips what it learns from (EnvSpec.clip_rewards), every reported return
is the game score.
`EnvOptions` holds the settings (AgentConfig's sticky_actions, full_action_space and
atari_backend).

The actors' Atari envs may instead come from EnvPool's C++ emulator threads (envpool_atari.py:
the same protocol, frame for frame, and the same SAME_STEP steps); `atari_backend` picks.
The evaluator and `apexrl eval` play one gymnasium env (make_env) whatever it says.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from apexrl.algorithms import pixel_envs  # noqa: F401 (registers apexrl/Catch-v0)

# Histogram buckets for episode returns (actor and evaluator metrics): CartPole (0..500), Atari
# scores above. No negative bounds: prometheus_client drops a histogram's _sum when its lowest
# bound is negative, and the dashboards' mean returns are _sum / _count; negative returns
# (Acrobot, Pendulum) land in the first bucket and still count in _sum.
RETURN_BUCKETS = (0, 10, 25, 50, 100, 200, 300, 400, 475, 500, 1000, 5000, 20000)
# Atari: emulator frames per env step (agent step), the same action repeated; the literature
# counts Atari runs in these frames.
FRAME_SKIP = 4
NOOP_MAX = 30  # Atari: up to this many no-op frames at an episode's start
SCREEN_SIZE = 84  # Atari: frames resized to SCREEN_SIZE x SCREEN_SIZE, gray
FRAME_STACK = 4  # Atari: an observation holds the last FRAME_STACK frames
ATARI_BACKENDS = ("auto", "gymnasium", "envpool")


@dataclass(frozen=True)
class EnvOptions:
    """Env settings beyond the id (AgentConfig: the same for actors, evaluator and learner)."""

    sticky_actions: float = 0.25  # Atari: P(the emulator repeats the previous action)
    full_action_space: bool = False  # Atari: all 18 actions instead of the game's minimal set
    atari_backend: str = "auto"  # Atari: the actors' emulator, one of ATARI_BACKENDS

    def __post_init__(self):
        if self.atari_backend not in ATARI_BACKENDS:
            raise ValueError(
                f"atari_backend: {self.atari_backend!r} is none of {', '.join(ATARI_BACKENDS)}"
            )

    @classmethod
    def of(cls, config) -> "EnvOptions":
        """From any settings object with the AgentConfig fields (defaults where absent)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(config, n) for n in names if hasattr(config, n)})


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def reward_threshold(env_id: str) -> float | None:
    """gymnasium's registered threshold (None for Atari games and envs without one)."""
    return None if is_atari(env_id) else gym.spec(env_id).reward_threshold


# Targets for envs gymnasium gives no reward_threshold (mean return of the best model).
TARGETS = {"Pendulum-v1": -200.0}


def default_target(env_id: str) -> float | None:
    """The best model's score that counts as solved on `env_id` when none is given."""
    return TARGETS.get(env_id, reward_threshold(env_id))


# A partially observed task: CartPole-v1 showing the cart's position and the pole's angle only.
# Without the velocities one observation cannot tell which way the pole swings; a policy that
# remembers the last ones can (a recurrent one). Same rewards, time limit and threshold (475).
MASKED_CARTPOLE = "apexrl/CartPoleNoVelocity-v1"


def _masked_cartpole(**kwargs) -> gym.Env:
    env = gym.make("CartPole-v1", **kwargs)
    seen = [0, 2]
    full = env.observation_space
    if not isinstance(full, gym.spaces.Box):
        raise ValueError(f"CartPole-v1: expected a Box observation space, got {full}")
    space = gym.spaces.Box(full.low[seen], full.high[seen], dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[seen], space)


gym.register(MASKED_CARTPOLE, entry_point=_masked_cartpole, reward_threshold=475.0)


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm needs to know of an env: its spaces."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int  # Discrete spaces; 0 for continuous ones
    action_shape: tuple[int, ...]  # () for Discrete
    action_low: np.ndarray | None  # Box bounds (float32), None for Discrete
    action_high: np.ndarray | None
    clip_rewards: bool = False  # learn from rewards clipped to [-1, 1] (Atari)

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    @property
    def vector_obs(self) -> bool:
        """1-D float observations (an MLP's input), as against uint8 [C, H, W] images."""
        return len(self.obs_shape) == 1 and np.issubdtype(self.obs_dtype, np.floating)


def make_env(
    env_id: str,
    options: EnvOptions = EnvOptions(),  # noqa: B008 (frozen)
    render_mode: str | None = None,
) -> gym.Env:
    """The one place an env is made (actors, evaluator, `apexrl eval`, local mode);
    render_mode "rgb_array" for recorded videos."""
    # Not every env takes a render_mode.
    rendering: dict[str, Any] = {"render_mode": render_mode} if render_mode else {}
    if not is_atari(env_id):
        return gym.make(env_id, **rendering)
    try:
        import ale_py
    except ImportError as err:
        raise ValueError(
            f"env {env_id}: Atari needs the atari extra (pip install apexrl[atari])"
        ) from err
    gym.register_envs(ale_py)
    env = gym.make(
        env_id,
        frameskip=1,  # AtariPreprocessing skips frames (and max-pools the last two)
        repeat_action_probability=options.sticky_actions,
        full_action_space=options.full_action_space,
        **rendering,
    )
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE
    )
    return gym.wrappers.FrameStackObservation(FireToStart(env), FRAME_STACK)


class FireToStart(gym.Wrapper):
    """Presses FIRE (one agent step) when an episode starts and after each life lost, in games
    that have lives and FIRE as action 1 (Breakout: FIRE launches the ball), as OpenAI
    Baselines' DQN wrappers do (FireResetEnv, and their reset on a life lost). Otherwise an
    agent that has not learnt to fire waits until the 108,000-frame cap. Games without lives
    (Pong) are left as they are."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        # ALE's own method, which gymnasium's Env does not declare.
        meanings = env.unwrapped.get_wrapper_attr("get_action_meanings")()
        self.fires = meanings[1:2] == ["FIRE"]
        self.lives = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.lives = info.get("lives", 0)
        if self.fires and self.lives > 0:
            obs, _, terminated, truncated, info = self.env.step(1)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
            self.lives = info.get("lives", 0)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lost = info.get("lives", 0) < self.lives
        if self.fires and lost and not (terminated or truncated):
            obs, more, terminated, truncated, info = self.env.step(1)
            reward += more
        self.lives = info.get("lives", 0)
        return obs, reward, terminated, truncated, info


def env_spec(env_id: str, options: EnvOptions = EnvOptions()) -> EnvSpec:  # noqa: B008
    env = make_env(env_id, options)
    try:
        obs, action = env.observation_space, env.action_space
    finally:
        env.close()
    if obs.shape is None or obs.dtype is None:
        raise ValueError(f"env {env_id}: observation space {obs} has no fixed shape and dtype")
    if isinstance(action, gym.spaces.Discrete):
        atari = is_atari(env_id)
        return EnvSpec(env_id, obs.shape, obs.dtype, int(action.n), (), None, None, atari)
    if isinstance(action, gym.spaces.Box):
        low, high = action.low.astype(np.float32), action.high.astype(np.float32)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"env {env_id}: unbounded action space {action}")
        return EnvSpec(env_id, obs.shape, obs.dtype, 0, action.shape, low, high)
    raise ValueError(f"env {env_id}: action space {action} is neither Discrete nor Box")


def make_vector_env(
    env_id: str,
    num_envs: int,
    seed: int,
    options: EnvOptions = EnvOptions(),  # noqa: B008 (frozen)
) -> tuple[VectorEnv, np.ndarray]:
    """A SAME_STEP-autoreset vector env, reset with seeds seed, seed+1, ...: a SyncVectorEnv,
    or for Atari games EnvPool's where options.atari_backend has it (envpool_atari.py).

    Returns (envs, first observations). The action space is seeded too.
    """
    if is_atari(env_id) and options.atari_backend != "gymnasium":
        from apexrl.algorithms import envpool_atari

        made = envpool_atari.make(env_id, num_envs, seed, options)
        if made is not None:
            return made
    envs = SyncVectorEnv(
        [lambda: make_env(env_id, options) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=seed)  # an int seed gives env i the seed seed + i
    envs.action_space.seed(seed)
    return envs, obs


def final_observations(next_obs: np.ndarray, infos: dict[str, Any]) -> np.ndarray:
    """next_obs with the final obs swapped in for envs whose episode just ended (a copy)."""
    result = np.array(next_obs, copy=True)
    if "final_obs" in infos:
        for i in np.flatnonzero(infos["_final_obs"]):
            result[i] = infos["final_obs"][i]
    return result
