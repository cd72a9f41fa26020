"""`apexrl local` with behaviour cloning: the learner's first version is the cloned policy, and
on demonstrations of a policy that holds CartPole up it solves CartPole before training."""

import re
import subprocess
import sys

import numpy as np
import pytest

from apexrl.algorithms import demonstrations
from apexrl.algorithms.envs import env_spec, make_env

pytestmark = pytest.mark.slow

ENV = "CartPole-v1"


def demonstrate(folder, episodes: int = 5) -> None:
    """Episodes of a rule that holds the pole up (500 on seeds 0..19): push the way the pole
    leans, its angular velocity counted at half weight."""
    env, played = make_env(ENV), []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        observations, steps, done = [obs], [], False
        while not done:
            action = int(obs[2] + 0.5 * obs[3] > 0)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            steps.append((action, reward, terminated, truncated))
            done = terminated or truncated
        actions, rewards, ended, cut = (np.array(column) for column in zip(*steps, strict=True))
        played.append(
            demonstrations.Episode(np.stack(observations), actions, rewards, ended, cut, seed)
        )
    env.close()
    demonstrations.save(demonstrations.prepare(str(folder)), env_spec(ENV), played)


def test_ppo_cloned_from_demonstrations_solves_cartpole_at_its_first_version(tmp_path):
    demonstrate(tmp_path / "demos")
    config = tmp_path / "run.toml"
    config.write_text(f'[learner]\npretrain_demonstrations = "{tmp_path / "demos"}"\n')
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "local", "--algorithm", "ppo", "--seed", "1",
         "--config", str(config), "--run-dir", str(run_dir), "--max-seconds", "60"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    assert re.match(r"solved in [\d.]+ s \(.*\) by version 1 \(mean return", last_line), last_line
    log = (run_dir / "logs" / "learner.log").read_text()
    cloned = re.search(r"behaviour cloning: 1000 steps on (\d+) pairs .* accuracy ([\d.]+)", log)
    assert cloned and int(cloned[1]) == 5 * 500 and float(cloned[2]) >= 0.95, log[-2000:]
