"""Demonstrations: whole episodes as files, written by `apexrl eval --record DIR` from a saved
model, or by anyone from their own episodes (a script, a person playing) with save().

A folder of demonstrations holds one .npz per episode and index.json (docs/demonstrations.md):

    observations  [T + 1, *obs_shape], the env's dtype: the reset observation, then the one after
                  each step (the last is the episode's final observation)
    actions       [T] int64 (Discrete) or [T, *action_shape] float32 (Box)
    rewards       [T] float64: the env's own (never shaped, never clipped)
    terminated    [T] bool; truncated [T] bool (a time limit)
    env_id        the gymnasium id; obs_shape (int64 [ndim]); obs_dtype (its name)
    action_space  JSON: {"kind": "discrete", "n": N} or {"kind": "box", "shape": [...]}
    seed          the reset seed that replays the episode (-1: not known)
    format        1

index.json: {"format": 1, "env_id": ..., "episodes": [{"file", "steps", "return", "seed"}]}.
Every array loads without pickle. load() checks each file against the env it is meant for and
names the file and the field that does not fit.
"""

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apexrl.algorithms.base import Policy
from apexrl.algorithms.envs import EnvOptions, EnvSpec, make_env
from apexrl.common import folders

FORMAT = 1
INDEX = "index.json"
# An episode file's arrays: the steps, then what they were played on.
STEPS = ("observations", "actions", "rewards", "terminated", "truncated")
DESCRIPTION = ("env_id", "obs_shape", "obs_dtype", "action_space", "seed", "format")
FIELDS = STEPS + DESCRIPTION


@dataclass
class Episode:
    """One episode of T steps (the module doc has each field's shape)."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    seed: int = -1

    @property
    def total(self) -> float:
        """The episode's return (the env's rewards)."""
        return float(np.sum(self.rewards))


def action_space(spec: EnvSpec) -> dict:
    """How a file describes the env's action space."""
    if spec.discrete:
        return {"kind": "discrete", "n": spec.num_actions}
    return {"kind": "box", "shape": list(spec.action_shape)}


def check(episode: Episode, spec: EnvSpec, where: str) -> None:
    """ValueError "where: field: ..." for an episode whose arrays do not fit the env."""
    steps = len(episode.rewards)
    action_shape = () if spec.discrete else spec.action_shape
    expected = {
        "observations": ((steps + 1, *spec.obs_shape), spec.obs_dtype),
        "actions": ((steps, *action_shape), np.int64 if spec.discrete else np.float32),
        "rewards": ((steps,), np.float64),
        "terminated": ((steps,), np.bool_),
        "truncated": ((steps,), np.bool_),
    }
    for name, (shape, dtype) in expected.items():
        array = getattr(episode, name)
        if array.shape != shape or array.dtype != np.dtype(dtype):
            raise ValueError(
                f"{where}: {name}: expected {np.dtype(dtype)} {list(shape)} for {spec.env_id}"
                f" ({steps} steps), got {array.dtype} {list(array.shape)}"
            )
    if spec.discrete and not ((episode.actions >= 0) & (episode.actions < spec.num_actions)).all():
        raise ValueError(f"{where}: actions: not all in 0..{spec.num_actions - 1}")
    ends = episode.terminated | episode.truncated
    if steps == 0 or not ends[-1] or ends[:-1].any():
        raise ValueError(f"{where}: terminated, truncated: the episode must end at its last step")


def save(folder: str | Path, spec: EnvSpec, episodes: list[Episode]) -> list[Path]:
    """Writes `episodes` of the env `spec` describes (env_spec(env_id)) and their index.json to
    `folder` (made by prepare()): the files, in order."""
    folder = Path(folder)
    entries, paths = [], []
    for k, episode in enumerate(episodes):
        check(episode, spec, f"episode {k}")
        path = folder / f"episode-{k:05d}.npz"
        np.savez_compressed(
            path,
            observations=episode.observations,
            actions=episode.actions,
            rewards=episode.rewards,
            terminated=episode.terminated,
            truncated=episode.truncated,
            env_id=np.array(spec.env_id),
            obs_shape=np.array(spec.obs_shape, np.int64),
            obs_dtype=np.array(np.dtype(spec.obs_dtype).name),
            action_space=np.array(json.dumps(action_space(spec))),
            seed=np.array(episode.seed, np.int64),
            format=np.array(FORMAT, np.int64),
        )
        steps = len(episode.rewards)
        entry = {"file": path.name, "steps": steps, "return": episode.total, "seed": episode.seed}
        entries.append(entry)
        paths.append(path)
    index = {"format": FORMAT, "env_id": spec.env_id, "episodes": entries}
    (folder / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return paths


def prepare(folder: str) -> Path:
    """The folder demonstrations go to, created; ValueError naming the setting for one that
    cannot be written or already holds demonstrations (an index.json)."""
    if (Path(folder) / INDEX).exists():
        raise ValueError(f"record: {folder} already holds demonstrations ({INDEX})")
    return folders.writable(folder, "record")


def load_episode(path: str | Path, spec: EnvSpec) -> Episode:
    """One episode file, checked against the env `spec` describes (ValueError naming the file
    and the field that does not fit)."""
    with np.load(path, allow_pickle=False) as data:
        missing = [name for name in FIELDS if name not in data.files]
        if missing:
            raise ValueError(f"{path}: {missing[0]}: missing")
        arrays = {name: data[name] for name in FIELDS}
    if int(arrays["format"]) != FORMAT:
        raise ValueError(f"{path}: format: {int(arrays['format'])}, this reads {FORMAT}")
    described = {
        "env_id": (str(arrays["env_id"]), spec.env_id),
        "obs_shape": (tuple(int(d) for d in arrays["obs_shape"]), tuple(spec.obs_shape)),
        "obs_dtype": (str(arrays["obs_dtype"]), np.dtype(spec.obs_dtype).name),
        "action_space": (json.loads(str(arrays["action_space"])), action_space(spec)),
    }
    for name, (found, expected) in described.items():
        if found != expected:
            raise ValueError(f"{path}: {name}: {found!r}, the env's is {expected!r}")
    episode = Episode(
        arrays["observations"],
        arrays["actions"],
        arrays["rewards"],
        arrays["terminated"],
        arrays["truncated"],
        int(arrays["seed"]),
    )
    check(episode, spec, str(path))
    return episode


def load(folder: str | Path, spec: EnvSpec) -> list[Episode]:
    """The episodes a folder's index.json lists, each checked by load_episode()."""
    folder = Path(folder)
    index = json.loads((folder / INDEX).read_text())
    if index.get("env_id") != spec.env_id:
        raise ValueError(f"{folder / INDEX}: env_id: {index.get('env_id')!r}, not {spec.env_id!r}")
    return [load_episode(folder / entry["file"], spec) for entry in index["episodes"]]


def pairs(
    folder: str | Path, spec: EnvSpec, setting: str = "pretrain_demonstrations"
) -> tuple[np.ndarray, np.ndarray]:
    """What behaviour cloning learns from: (observations [N, *obs_shape], actions [N, ...]), each
    observation of the folder's episodes with the action taken on it (the last one of each
    episode, which nothing was taken on, left out). ValueError naming `setting` and the file
    for a folder that is not one of demonstrations of this env, or that holds none."""
    index = Path(folder) / INDEX
    if not index.is_file():
        raise ValueError(
            f"{setting}: {index}: no such file (a folder of demonstrations, as apexrl eval"
            " --record writes, holds one)"
        )
    try:
        episodes = load(folder, spec)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise ValueError(f"{setting}: {err}") from None
    if not episodes:
        raise ValueError(f"{setting}: {index}: lists no episodes")
    observations = np.concatenate([episode.observations[:-1] for episode in episodes])
    return observations, np.concatenate([episode.actions for episode in episodes])


def play(policy: Policy, spec: EnvSpec, seed: int, exploration: float, options: EnvOptions):
    """One episode of `policy` on reset seed `seed`, played as the video recorder plays it
    (its own generator seeded with `seed`)."""
    env = make_env(spec.env_id, options)
    rng = np.random.default_rng(seed)
    try:
        obs, _ = env.reset(seed=seed)
        observations, actions, rewards, terminated, truncated = [obs], [], [], [], []
        policy.episode_starts(np.ones(1, bool))
        done = False
        while not done:
            action = policy.act(np.asarray(obs)[None], exploration, rng)[0]
            obs, reward, ended, cut, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(float(reward))
            terminated.append(bool(ended))
            truncated.append(bool(cut))
            done = bool(ended or cut)
    finally:
        env.close()
    return Episode(
        np.stack(observations),
        np.array(actions, np.int64 if spec.discrete else np.float32),
        np.array(rewards, np.float64),
        np.array(terminated),
        np.array(truncated),
        seed,
    )


def record(
    policy: Policy,
    spec: EnvSpec,
    episodes: int,
    seed: int,
    exploration: float,
    options: EnvOptions,
    folder: Path,
) -> tuple[np.ndarray, list[Path]]:
    """`episodes` episodes on seeds seed, seed + 1, ..., one after the other, written to
    `folder` (made by prepare()): (their returns, their files)."""
    played = [play(policy, spec, seed + k, exploration, options) for k in range(episodes)]
    paths = save(folder, spec, played)
    return np.array([episode.total for episode in played]), paths
