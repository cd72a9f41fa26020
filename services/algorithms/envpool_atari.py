"""EnvPool as the actors' Atari emulator: the protocol of envs.make_env, stepped in C++.

EnvPool (Weng et al. 2022) runs ALE with the frame skip, the max of the last two frames, the
gray conversion and the resize in C++, for a batch of envs per call. Set up as below it plays
the protocol of envs.py frame for frame (tests/unit/test_envpool_atari.py compares the two
backends' observations, rewards and episode ends with sticky actions off and one no-op):

- EnvPool's options: repeat_action_probability = sticky_actions, frame skip 4 with the max of
  the last two frames, 1 to 30 no-op frames at a start, 84x84 gray (INTER_AREA), the game's
  rewards (no clip), a lost life not an episode end. Its use_fire_reset stays off: it presses
  FIRE for one frame in place of a no-op in every game with FIRE (Pong too), not FireToStart.
- Here, in numpy: FireToStart (FIRE, one agent step, at the start and after each life lost in
  games with lives and FIRE as action 1, only the frame after it stacked), the stack of 4 (so
  EnvPool keeps one frame, stack_num 1), and gymnasium's SAME_STEP autoreset: EnvPool resets
  an ended env on its next step (NEXT_STEP), so the envs that end are reset within the same
  call and their final observation goes to infos["final_obs"] (mask infos["_final_obs"]).
- Episodes are cut at 27,000 agent steps counted after the no-ops; gymnasium's 108,000
  frames count the no-ops too (at most 7 agent steps apart, in games that last 30 minutes).

`atari_backend` (EnvOptions) picks: "envpool" here or a ValueError naming what it cannot do,
"auto" here where it can else the gymnasium path with one log line saying why, "gymnasium"
never here. One EnvPool thread an actor: an actor is one core, scale with actors.
"""

import dataclasses
import logging

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from apexrl.algorithms import envs
from apexrl.algorithms.envs import FRAME_SKIP, FRAME_STACK, SCREEN_SIZE, EnvOptions

log = logging.getLogger(__name__)

MAX_EPISODE_STEPS = 108_000 // FRAME_SKIP  # ALE v5's 108,000 frames, in agent steps
FIRE = 1  # the action FireToStart presses (envs.FireToStart: games whose action 1 is FIRE)
# The EnvOptions fields this backend plays as the gymnasium path does; any other one set away
# from its default sends the env to gymnasium (auto) or is refused (envpool).
HONOURED = frozenset({"sticky_actions", "full_action_space", "atari_backend"})


def task(env_id: str) -> str:
    """EnvPool's id of an ALE one: ALE/Pong-v5 -> Pong-v5."""
    return env_id.removeprefix("ALE/")


def refusal(env_id: str, options: EnvOptions) -> str | None:
    """Why EnvPool cannot play `env_id` with `options` as the gymnasium path would (None: it
    can)."""
    try:
        import envpool
    except ImportError:
        return "EnvPool is not installed (pip install envpool)"
    if task(env_id) not in envpool.list_all_envs():
        return f"EnvPool has no env {task(env_id)!r} (for {env_id})"
    defaults = EnvOptions()
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if field.name not in HONOURED and value != getattr(defaults, field.name):
            return f"EnvPool cannot honour {field.name}={value!r}"
    return None


def make(
    env_id: str,
    num_envs: int,
    seed: int,
    options: EnvOptions,
    max_episode_steps: int = MAX_EPISODE_STEPS,
) -> tuple["EnvPoolAtari", np.ndarray] | None:
    """EnvPool's vector env for `env_id` and its first observations, env i seeded seed + i;
    None where atari_backend is "auto" and EnvPool cannot play it (logged)."""
    reason = refusal(env_id, options)
    if reason is not None:
        if options.atari_backend == "envpool":
            raise ValueError(f"atari_backend 'envpool': {reason}")
        log.info("%s: gymnasium's emulator, not EnvPool (atari_backend auto): %s", env_id, reason)
        return None
    import envpool

    pool = envpool.make(
        task(env_id),
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,  # synchronous: every step is the whole batch's
        num_threads=1,
        seed=seed % (2**31 - num_envs),  # env i takes seed + i, an int32
        max_episode_steps=max_episode_steps,
        repeat_action_probability=options.sticky_actions,
        full_action_space=options.full_action_space,
        frame_skip=FRAME_SKIP,
        noop_max=envs.NOOP_MAX,  # read here: tests change it
        img_height=SCREEN_SIZE,
        img_width=SCREEN_SIZE,
        gray_scale=True,
        use_inter_area_resize=True,
        stack_num=1,
        reward_clip=False,
        episodic_life=False,
        zero_discount_on_life_loss=False,
        use_fire_reset=False,
    )
    log.info(
        "%s: %d envs in EnvPool %s (atari_backend %s)",
        env_id,
        num_envs,
        envpool.__version__,
        options.atari_backend,
    )
    vector = EnvPoolAtari(pool, num_envs, fires(env_id, options))
    obs, _ = vector.reset()
    vector.action_space.seed(seed)
    return vector, obs


def fires(env_id: str, options: EnvOptions) -> bool:
    """Whether action 1 is FIRE in the game's action set (FireToStart's test; it also needs
    lives, which EnvPool reports at each start)."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make(env_id, full_action_space=options.full_action_space)
    try:
        return env.unwrapped.get_wrapper_attr("get_action_meanings")()[1:2] == ["FIRE"]
    finally:
        env.close()


class EnvPoolAtari(VectorEnv):
    """A SAME_STEP vector env over an EnvPool of one-frame Atari envs (see the module's
    docstring): observations uint8 [num_envs, 4, 84, 84]."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, pool, num_envs: int, fires: bool):
        self.pool, self.num_envs, self.fires = pool, num_envs, fires
        shape = (FRAME_STACK, SCREEN_SIZE, SCREEN_SIZE)
        self.single_observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.single_action_space = gym.spaces.Discrete(int(pool.action_space.n))
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.stack = np.zeros((num_envs, *shape), np.uint8)
        self.lives = np.zeros(num_envs, np.int64)

    def reset(self, *, seed=None, options=None):
        """Every env starts a new episode. EnvPool's envs are seeded when made (make's seed)."""
        if seed is not None or options is not None:
            raise ValueError("EnvPoolAtari.reset: seeds are make()'s, options are not taken")
        everyone = np.arange(self.num_envs)
        self.stack[:], self.lives[:] = self.start(everyone)
        return self.stack.copy(), {"lives": self.lives.copy()}

    def start(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New episodes for envs `ids`: their first frames [len(ids), 1, 84, 84] and lives, with
        FireToStart's FIRE where the game has it and lives (an episode the FIRE ends restarts,
        without FIRE, as FireToStart does)."""
        frames, info = self.pool.reset(ids.astype(np.int32))
        frames, lives = np.array(frames), np.array(info["lives"], np.int64)
        fire = np.flatnonzero(lives > 0) if self.fires else np.empty(0, np.int64)
        if fire.size:
            fired, _, _, truncated, info = self.pool.step(
                np.full(fire.size, FIRE, np.int32), env_id=ids[fire].astype(np.int32)
            )
            frames[fire], lives[fire] = fired, info["lives"]
            ended = np.flatnonzero(np.asarray(info["terminated"], bool) | truncated)
            if ended.size:
                again, info = self.pool.reset(ids[fire[ended]].astype(np.int32))
                frames[fire[ended]], lives[fire[ended]] = again, info["lives"]
        return frames, lives

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """One agent step of every env (SAME_STEP: see the module's docstring)."""
        frames, rewards, _, truncated, info = self.pool.step(np.asarray(actions, np.int32))
        rewards = np.asarray(rewards, np.float64)  # as SyncVectorEnv's (a copy)
        terminated = np.array(info["terminated"], bool)  # the game's end, as ALE's
        truncated = np.array(truncated, bool)
        lives = np.array(info["lives"], np.int64)
        self.stack[:, :-1] = self.stack[:, 1:]
        self.stack[:, -1] = frames[:, 0]
        if self.fires:  # FireToStart: FIRE after a life lost, only the frame after it stacked
            lost = np.flatnonzero((lives < self.lives) & ~(terminated | truncated))
            if lost.size:
                fired, more, _, cut, info = self.pool.step(
                    np.full(lost.size, FIRE, np.int32), env_id=lost.astype(np.int32)
                )
                self.stack[lost, -1] = fired[:, 0]
                rewards[lost] += more
                terminated[lost] = np.asarray(info["terminated"], bool)
                truncated[lost] = cut
                lives[lost] = info["lives"]
        infos: dict = {"lives": lives}
        ended = terminated | truncated
        if ended.any():
            ids = np.flatnonzero(ended)
            infos["final_obs"], infos["_final_obs"] = self.stack.copy(), ended
            frames, lives[ids] = self.start(ids)
            self.stack[ids] = frames  # the first frame, repeated over the stack
        self.lives = lives.copy()
        return self.stack.copy(), rewards, terminated, truncated, infos

    def close(self, **kwargs) -> None:
        self.pool.close()
