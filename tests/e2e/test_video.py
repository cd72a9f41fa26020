"""`apexrl eval --video DIR`: each played episode as an mp4 that decodes to the episode's
frames, named by version, seed and the return eval prints; bad input refused, nothing made."""

import dataclasses
import re
import subprocess
import sys

import gymnasium as gym
import imageio_ffmpeg
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from apexrl import algorithms, cli
from apexrl import config as cfg
from apexrl.algorithms import video
from apexrl.algorithms.envs import EnvOptions, make_env
from apexrl.algorithms.video import BestVideos, record_episode
from apexrl.common import checkpoint

ENV = "CartPole-v1"


class NoRenderCartPole(CartPoleEnv):
    metadata = {"render_modes": ["human"], "render_fps": 50}


gym.register("NoRenderCartPole-v0", entry_point=NoRenderCartPole, max_episode_steps=500)


def save_policy(directory, kind: str, version: int, env: str = ENV, **extra) -> None:
    """A checkpoint of an untrained dqn policy (seeded: the same weights every time)."""
    config = cfg.LearnerConfig(env=env, seed=1)
    torch.manual_seed(version)
    learning = algorithms.make(config).learning(config, torch.device("cpu"))
    arrays = {f"online/{k}": v for k, v in learning.parameters().items()}
    meta = {"config": dataclasses.asdict(config), "version": version, "update_step": 10 * version}
    checkpoint.write_checkpoint(directory, kind, meta | extra, arrays)


def decoded(path) -> tuple[tuple[int, int], int]:
    """(frame width and height, frames) of a video, decoded by ffmpeg."""
    frames = imageio_ffmpeg.read_frames(str(path))
    size = next(frames)["size"]
    return tuple(size), sum(1 for _ in frames)


def render_size(env_id: str) -> tuple[int, int]:
    env = make_env(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    height, width, _ = env.render().shape
    env.close()
    return width, height


def eval_command(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", *map(str, argv)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
def test_each_episode_is_a_video_of_its_steps_named_by_the_return_eval_prints(tmp_path):
    ckpt = tmp_path / "checkpoints"
    save_policy(ckpt, "best", 3, mean_return=9.0, returns=[9.0],
                protocol={"env": ENV, "episodes": 1, "first_seed": 1, "epsilon": 0.0})  # fmt: skip
    save_policy(ckpt, "learner", 5)
    videos = tmp_path / "videos"
    played = eval_command("--checkpoint", ckpt, "--episodes", 3, "--seed", 40, "--video", videos)
    assert played.returncode == 0, played.stderr
    printed = [float(r) for r in re.search(r"^returns: (.*)$", played.stdout, re.M)[1].split()]
    files = sorted(videos.iterdir(), key=lambda p: int(re.search(r"seed-(\d+)", p.name)[1]))
    assert [p.name for p in files] == [
        f"CartPole-v1-version-3-seed-{40 + k}-return-{r:g}.mp4" for k, r in enumerate(printed)
    ]  # the best model's version (3), not the newest checkpoint's
    listed = re.findall(r"^video: (.*) \((\d+) steps\)$", played.stdout, re.M)
    assert [path for path, _ in listed] == [str(p) for p in files]
    for path, (_, steps), episode_return in zip(files, listed, printed, strict=True):
        size, frames = decoded(path)
        assert size == render_size(ENV)
        assert frames == int(steps) + 1  # the reset frame, then one a step
        assert int(steps) == episode_return  # CartPole: a reward of 1 a step

    # The same seeds without --video: the same returns (the recording plays as eval does).
    plain = eval_command("--checkpoint", ckpt, "--episodes", 3, "--seed", 40)
    assert re.search(r"^returns: (.*)$", plain.stdout, re.M)[1] == " ".join(
        f"{r:g}" for r in printed
    )
    latest = eval_command("--checkpoint", ckpt, "--latest", "--episodes", 1, "--video", videos)
    assert latest.returncode == 0, latest.stderr
    assert len(list(videos.glob("CartPole-v1-version-5-seed-1000000-return-*.mp4"))) == 1


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(["eval", *map(str, argv)])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err.strip()


def test_a_folder_that_cannot_be_written_is_one_line_exit_2_and_nothing_made(tmp_path, capsys):
    save_policy(tmp_path / "ckpt", "learner", 1)
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    before = sorted(tmp_path.rglob("*"))
    err = refused(["--checkpoint", tmp_path / "ckpt", "--video", blocker / "videos"], capsys)
    assert err == f"apexrl eval: error: video: cannot write to {blocker}/videos (Not a directory)"
    assert sorted(tmp_path.rglob("*")) == before
    assert blocker.read_text() == "a file, not a folder"


def test_an_env_without_rgb_array_is_one_line_exit_2_and_no_folder(tmp_path, capsys):
    save_policy(tmp_path / "ckpt", "learner", 1, env="NoRenderCartPole-v0")
    videos = tmp_path / "videos"
    err = refused(["--checkpoint", tmp_path / "ckpt", "--video", videos], capsys)
    assert err == (
        "apexrl eval: error: video: env NoRenderCartPole-v0 renders no rgb_array frames"
        " (its modes: ['human'])"
    )
    assert not videos.exists()


def test_the_evaluator_records_the_1st_then_every_kth_new_best(tmp_path):
    config = cfg.EvaluatorConfig(env=ENV, video_every=2, video_dir=str(tmp_path / "v"))
    policy = algorithms.make(config).policy()
    learner = cfg.LearnerConfig(env=ENV)
    policy.load(algorithms.make(learner).learning(learner, torch.device("cpu")).parameters())
    videos = BestVideos(policy, config)
    recorded = [videos.new_best(version, seed=100 + version) for version in range(1, 6)]
    assert [p is not None for p in recorded] == [True, False, True, False, True]
    assert sorted(p.name.split("-return-")[0] for p in (tmp_path / "v").iterdir()) == [
        f"CartPole-v1-version-{v}-seed-{100 + v}" for v in (1, 3, 5)
    ]
    for path in filter(None, recorded):
        episode_return = float(re.search(r"-return-(.*)\.mp4$", path.name)[1])
        assert decoded(path) == (render_size(ENV), episode_return + 1)  # CartPole: 1 a step


def test_a_video_that_cannot_be_written_leaves_the_evaluator_going(tmp_path, monkeypatch):
    """ffmpeg can die under the evaluator (its stdin then a broken pipe): a video is a side
    product, so that new best goes without one and the next is recorded."""
    config = cfg.EvaluatorConfig(env=ENV, video_every=1, video_dir=str(tmp_path / "v"))
    policy = algorithms.make(config).policy()
    learner = cfg.LearnerConfig(env=ENV)
    policy.load(algorithms.make(learner).learning(learner, torch.device("cpu")).parameters())
    videos = BestVideos(policy, config)
    working = video.record_episode

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(video, "record_episode", broken)
    assert videos.new_best(1, seed=101) is None
    monkeypatch.setattr(video, "record_episode", working)
    assert videos.new_best(2, seed=102).name.startswith(f"{ENV}-version-2-seed-102")


@pytest.mark.slow
def test_an_atari_episode_is_recorded_at_the_emulator_screen_size(tmp_path):
    pytest.importorskip("ale_py")
    ckpt = tmp_path / "ckpt"
    save_policy(ckpt, "learner", 2, env="ALE/Pong-v5")
    played = eval_command("--checkpoint", ckpt, "--episodes", 1, "--video", tmp_path / "v")
    assert played.returncode == 0, played.stderr
    (path,) = (tmp_path / "v").iterdir()
    episode_return = re.search(r"^returns: (\S+)$", played.stdout, re.M)[1]
    assert path.name == f"ALE-Pong-v5-version-2-seed-1000000-return-{episode_return}.mp4"
    steps = int(re.search(r"^video: .* \((\d+) steps\)$", played.stdout, re.M)[1])
    assert decoded(path) == (render_size("ALE/Pong-v5"), steps + 1) == ((160, 210), steps + 1)


class Counter(gym.Env):
    """Frames that show their own index (a grey level), 50 a second, an episode of `steps`."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, render_mode=None, steps=500):
        self.render_mode, self.steps, self.t = render_mode, steps, 0
        self.observation_space = gym.spaces.Box(0, 1, (1,))
        self.action_space = gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= self.steps, False, {}

    def render(self):
        return np.full((48, 64, 3), self.t % 256, np.uint8)


gym.register("FrameCounter-v0", entry_point=Counter)


class Constant:
    def episode_starts(self, starts):
        pass

    def act(self, obs, exploration, rng):
        return np.zeros(len(obs), np.int64)


def test_every_frame_captured_is_in_the_video_in_order(tmp_path):
    """501 frames at 50 fps: moviepy's encoder would write 500 (its float frame times)."""
    total, steps, path = record_episode(
        Constant(), "FrameCounter-v0", 0, 0.0, EnvOptions(), tmp_path, version=1
    )
    assert (total, steps) == (500.0, 500)
    frames = imageio_ffmpeg.read_frames(str(path))
    assert tuple(next(frames)["size"]) == (64, 48)
    grey = [np.frombuffer(f, np.uint8).reshape(48, 64, 3).mean() for f in frames]
    assert len(grey) == 501
    np.testing.assert_allclose(grey, np.arange(501) % 256, atol=3)  # lossy, but in order
