"""Episodes recorded as mp4 with gymnasium's RecordVideo: `apexrl eval --video DIR` and the
evaluator's video_every.

RecordVideo captures the frames (the reset frame, then one after each step); they are encoded
here with imageio-ffmpeg rather than by RecordVideo's moviepy, whose ImageSequenceClip adds up
float frame durations and so drops the last frame of some episodes (501 frames at 50 fps
come out as 500) or repeats frames at some rates (moviepy issues 2507 and 2412, open in
moviepy 2.2). moviepy stays a dependency: RecordVideo refuses to start without it.

A recorded episode is played as evaluate() plays the episode of the same seed (same reset
seed, same policy call), one env at a time: RecordVideo keeps an episode's frames in memory
until it ends (a CartPole frame is 600x400x3 bytes, 500 of them 360 MB), so episodes are
never recorded side by side.
"""

import logging
import os
import warnings
from pathlib import Path

import numpy as np
from gymnasium.wrappers import RecordVideo

from apexrl.algorithms.base import Policy
from apexrl.algorithms.envs import EnvOptions, is_atari, make_env
from apexrl.common import folders

log = logging.getLogger(__name__)

# ALE runs at 60 frames a second and the agent sees every 4th (frame skip 4): one frame per
# agent step at 15 a second plays at the game's speed (ALE's own render_fps says 30).
ATARI_FPS = 15


class ExactRecordVideo(RecordVideo):
    """RecordVideo whose video holds exactly the frames it captured (see the module doc)."""

    def stop_recording(self) -> None:
        import imageio_ffmpeg

        # rgb_array frames: RecordVideo refuses the render modes that give other ones.
        frames = [np.asarray(frame) for frame in self.recorded_frames]
        if frames:
            height, width = frames[0].shape[:2]
            writer = imageio_ffmpeg.write_frames(
                os.path.join(self.video_folder, f"{self._video_name}.mp4"),
                (width, height),
                fps=self.frames_per_sec,
                macro_block_size=2,  # yuv420p needs even sides; 16 would rescale 600x400
                ffmpeg_log_level="error",
            )
            writer.send(None)  # starts ffmpeg
            for frame in frames:
                writer.send(np.ascontiguousarray(frame))
            writer.close()
        self.recorded_frames, self.recording, self._video_name = [], False, None


def prepare(env_id: str, options: EnvOptions, folder: str) -> Path:
    """The folder videos of `env_id` go to, created; ValueError naming what cannot work (an env
    without rgb_array rendering, moviepy missing, a folder that cannot be written), checked
    in that order so that a refusal leaves no folder behind."""
    env = make_env(env_id, options)
    try:
        modes = list(env.metadata.get("render_modes") or [])
    finally:
        env.close()
    if "rgb_array" not in modes:
        raise ValueError(f"video: env {env_id} renders no rgb_array frames (its modes: {modes})")
    try:
        import imageio_ffmpeg  # noqa: F401 (the encoder)
        import moviepy  # noqa: F401 (RecordVideo refuses to start without it)
    except ImportError as err:
        raise ValueError(
            f"video: recording needs moviepy and imageio-ffmpeg ({err.name} is missing:"
            " pip install apexrl[video])"
        ) from err
    return folders.writable(folder, "video")


def file_name(env_id: str, version: int, seed: int, episode_return: float) -> str:
    """What a recorded episode is called: the env, the parameter version, the seed that replays
    it, and its return."""
    return f"{env_id.replace('/', '-')}-version-{version}-seed-{seed}-return-{episode_return:g}.mp4"


def record_episode(
    policy: Policy,
    env_id: str,
    seed: int,
    exploration: float,
    options: EnvOptions,
    folder: Path,
    version: int,
) -> tuple[float, int, Path]:
    """Plays one episode on `seed` and writes it to `folder` (made by prepare()); returns
    (its return, its steps, the video's path). The video holds steps + 1 frames: the reset
    frame, then one after each step."""
    stem = f".recording-{os.getpid()}-{seed}"  # renamed once the return is known
    with warnings.catch_warnings():  # "overwriting existing videos": names never repeat here
        warnings.simplefilter("ignore")
        env = ExactRecordVideo(
            make_env(env_id, options, render_mode="rgb_array"),
            str(folder),
            episode_trigger=lambda _: True,
            name_prefix=stem,
            fps=ATARI_FPS if is_atari(env_id) else None,
        )
    recorded = folder / f"{stem}-episode-0.mp4"
    rng = np.random.default_rng(seed)
    total, steps, done = 0.0, 0, False
    try:
        obs, _ = env.reset(seed=seed)
        policy.episode_starts(np.ones(1, bool))
        while not done:
            action = policy.act(np.asarray(obs)[None], exploration, rng)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
    except BaseException:
        env.close()
        recorded.unlink(missing_ok=True)  # no half an episode under a name that says its return
        raise
    env.close()  # writes the mp4
    path = folder / file_name(env_id, version, seed, total)
    os.replace(recorded, path)
    return total, steps, path


def record_episodes(
    policy: Policy,
    env_id: str,
    episodes: int,
    seed: int,
    exploration: float,
    options: EnvOptions,
    folder: Path,
    version: int,
) -> tuple[np.ndarray, list[tuple[Path, int]]]:
    """`episodes` episodes on seeds seed, seed + 1, ..., one after the other, each its own
    video: (their returns, (each video's path, its episode's steps))."""
    returns, videos = [], []
    for k in range(episodes):
        total, steps, path = record_episode(
            policy, env_id, seed + k, exploration, options, folder, version
        )
        returns.append(total)
        videos.append((path, steps))
    return np.array(returns), videos


class BestVideos:
    """The evaluator's video_every: one episode of the 1st, (K+1)-th, (2K+1)-th, ... new best
    model, played on the first seed of the round that made it the best (so the video shows
    that round's first episode)."""

    def __init__(self, policy: Policy, config):
        """config: the evaluator's (env, epsilon, video_every, video_dir)."""
        if config.video_every < 0:
            raise ValueError(f"video_every: must be >= 0 (0: no videos), got {config.video_every}")
        self.policy, self.config, self.options = policy, config, EnvOptions.of(config)
        self.folder = prepare(config.env, self.options, config.video_dir)
        self.new_bests = 0

    def new_best(self, version: int, seed: int) -> Path | None:
        """Counts a new best model (its parameters loaded in the policy); the video's path when
        this one is recorded."""
        self.new_bests += 1
        if (self.new_bests - 1) % self.config.video_every:
            return None
        c = self.config
        try:
            _, _, path = record_episode(
                self.policy, c.env, seed, c.epsilon, self.options, self.folder, version
            )
        except OSError as err:  # ffmpeg gone (a broken pipe): the evaluation goes on without it
            log.warning("video of version %d not written: %s", version, err)
            return None
        return path
