"""Demonstrations: `apexrl eval --record DIR` writes episodes that replay to their returns, the
loader refuses a file for another env naming the field, and the docs' conversion example runs."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from apexrl import algorithms, play
from apexrl import config as cfg
from apexrl.algorithms import demonstrations
from apexrl.algorithms.envs import env_spec, make_env
from apexrl.common import checkpoint

ENV = "CartPole-v1"
DOC = Path(__file__).resolve().parents[2] / "docs" / "demonstrations.md"


def save_policy(directory: Path) -> None:
    """A learner checkpoint of an untrained dqn policy (seeded: the same weights every time)."""
    config = cfg.LearnerConfig(env=ENV, seed=1)
    torch.manual_seed(1)
    learning = algorithms.make(config).learning(config, torch.device("cpu"))
    arrays = {f"online/{k}": v for k, v in learning.parameters().items()}
    meta = {"config": dataclasses.asdict(config), "version": 1, "update_step": 10}
    checkpoint.write_checkpoint(directory, "learner", meta, arrays)


@pytest.fixture
def recorded(tmp_path, capsys) -> tuple[Path, list[float]]:
    """Two episodes (seeds 40, 41) recorded by `apexrl eval --record`, and the returns it printed."""
    save_policy(tmp_path / "ckpt")
    folder = tmp_path / "demos"
    argv = ["--checkpoint", tmp_path / "ckpt", "--episodes", 2, "--seed", 40, "--record", folder]
    assert play.main([str(a) for a in argv]) == 0
    out = capsys.readouterr().out
    assert f"demonstrations: 2 episodes in {folder} (index.json)" in out
    return folder, [float(r) for r in re.search(r"^returns: (.*)$", out, re.M)[1].split()]


def test_a_recorded_episode_replays_to_its_return(recorded, capsys):
    """Each episode, played again from its seed with its actions, gives its observations and
    its return exactly; the returns are those eval printed, with --record and without."""
    folder, printed = recorded
    argv = ["--checkpoint", folder.parent / "ckpt", "--episodes", 2, "--seed", 40]
    assert play.main([str(a) for a in argv]) == 0
    plain = re.search(r"^returns: (.*)$", capsys.readouterr().out, re.M)[1]
    assert plain == " ".join(f"{r:g}" for r in printed)
    episodes = demonstrations.load(folder, env_spec(ENV))
    assert [e.seed for e in episodes] == [40, 41]
    index = json.loads((folder / "index.json").read_text())
    assert [entry["return"] for entry in index["episodes"]] == printed
    for episode, expected in zip(episodes, printed, strict=True):
        env = make_env(ENV)
        obs, _ = env.reset(seed=episode.seed)
        observations, total = [obs], 0.0
        for action in episode.actions:
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            total += float(reward)
        env.close()
        assert total == episode.total == expected
        assert (terminated, truncated) == (episode.terminated[-1], episode.truncated[-1])
        np.testing.assert_array_equal(np.stack(observations), episode.observations)


def test_the_loader_refuses_a_file_for_another_env_naming_the_file_and_field(recorded):
    folder, _ = recorded
    path = folder / "episode-00000.npz"
    spec = env_spec(ENV)
    others = [
        (env_spec("Acrobot-v1"), "env_id: 'CartPole-v1', the env's is 'Acrobot-v1'"),
        (dataclasses.replace(spec, obs_shape=(5,)), "obs_shape: (4,), the env's is (5,)"),
        (dataclasses.replace(spec, obs_dtype=np.dtype(np.float64)), "obs_dtype: 'float32'"),
        (dataclasses.replace(spec, num_actions=3), "action_space: {'kind': 'discrete', 'n': 2}"),
    ]
    for other, message in others:
        with pytest.raises(ValueError) as refused:
            demonstrations.load_episode(path, other)
        assert str(refused.value).startswith(f"{path}: {message}")
    with np.load(path) as data:  # a file without its seed
        arrays = {name: data[name] for name in data.files if name != "seed"}
    np.savez(folder / "seedless.npz", **arrays)
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'seedless.npz'}: seed: missing")):
        demonstrations.load_episode(folder / "seedless.npz", spec)
    arrays["seed"], arrays["actions"] = np.array(40), arrays["actions"] + 2  # actions out of range
    np.savez(folder / "wrong.npz", **arrays)
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'wrong.npz'}: actions: not all")):
        demonstrations.load_episode(folder / "wrong.npz", spec)


def test_a_folder_that_holds_demonstrations_is_refused_and_left_as_it_is(recorded, capsys):
    folder, _ = recorded
    before = {p: p.read_bytes() for p in folder.iterdir()}
    ckpt = folder.parent / "ckpt"
    for extra in ([], ["--video", folder.parent / "videos"]):
        argv = ["--checkpoint", ckpt, "--episodes", 1, "--record", folder, *extra]
        assert play.main([str(a) for a in argv]) == 2
        assert capsys.readouterr().err.startswith("apexrl eval: error: record: ")
    assert {p: p.read_bytes() for p in folder.iterdir()} == before
    assert not (folder.parent / "videos").exists()


def test_the_docs_conversion_example_writes_what_the_loader_reads(tmp_path, monkeypatch):
    """The example of docs/demonstrations.md, run as it is written (in a fresh folder)."""
    example = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)[1]
    assert len(example.splitlines()) <= 15
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(DOC), "exec"), {})
    episodes = demonstrations.load(tmp_path / "my-demos", env_spec(ENV))
    assert len(episodes) == 1 and episodes[0].seed == 7
    assert episodes[0].total == len(episodes[0].actions)  # CartPole: 1 a step


def test_a_folder_that_cannot_be_written_is_refused_naming_record(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError) as refused:
        demonstrations.prepare(str(blocker / "demos"))
    assert str(refused.value) == f"record: cannot write to {blocker}/demos (Not a directory)"
