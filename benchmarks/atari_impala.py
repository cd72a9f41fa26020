"""IMPALA's env frames/s on Pong next to Stable-Baselines3 PPO's (rl-baselines3-zoo Atari
settings), side by side on this machine.

    .venv/bin/python benchmarks/atari_impala.py [--seconds 90]

apexrl: `apexrl local --algorithm impala --env ALE/Pong-v5` (local mode's settings: 2 actors x
4 envs, unrolls of 32, batches of 8 unrolls) for --seconds; frames/s = 4 x the env steps its
actors made after the first one (metrics.csv; `startup_seconds` excluded) / the seconds since.
SB3: PPO("CnnPolicy") with hyperparams/ppo.yml's atari entry (8 envs, n_steps 128, 4 epochs,
batch 256, lr 2.5e-4 and clip 0.1 (the zoo decays both linearly; constant here over a short
run), vf_coef 0.5, ent_coef 0.01) on ALE/Pong-v5 with frameskip 1 under SB3's AtariWrapper
(frame skip 4, 84x84 grey) and a 4-frame stack, learning for --seconds on one torch thread;
frames/s = 4 x its timesteps / the seconds `learn` ran. Both count agent steps x 4 frames
(frame skip 4), training included. The last line is one JSON object.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from atari import FRAME_SKIP, run_local_pong  # noqa: E402  (benchmarks/ is not a package)


def apexrl_frames_per_s(seconds: float, folder: Path) -> dict:
    rows = run_local_pong(seconds, folder / "impala-pong", "--algorithm", "impala")
    rows = [r for r in rows if float(r["env_steps"]) > 0]
    if len(rows) < 2:  # start-up (imports, ALE, the first parameters) took the whole budget
        sys.exit(
            f"apexrl local stepped in fewer than two progress rows in {seconds:g} s: raise --seconds"
        )
    first, last = rows[0], rows[-1]
    steps = float(last["env_steps"]) - float(first["env_steps"])
    elapsed = float(last["seconds"]) - float(first["seconds"])
    return {
        "frames_per_s": round(FRAME_SKIP * steps / elapsed),
        "env_steps": int(float(last["env_steps"])),
        "updates": int(float(last["updates"])),
        "seconds": round(elapsed, 1),
    }


def sb3_frames_per_s(seconds: float) -> dict:
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)  # the ALE/ ids
    torch.set_num_threads(1)

    class Budget(BaseCallback):
        def _on_step(self) -> bool:
            return time.monotonic() - started < seconds

    env = VecFrameStack(
        make_atari_env("ALE/Pong-v5", n_envs=8, seed=1, env_kwargs={"frameskip": 1}), 4
    )
    model = PPO(
        "CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4,
        clip_range=0.1, vf_coef=0.5, ent_coef=0.01, seed=1, device="cpu", verbose=0,
    )  # fmt: skip
    started = time.monotonic()
    model.learn(total_timesteps=10**9, callback=Budget())
    elapsed = time.monotonic() - started
    env.close()
    return {
        "frames_per_s": round(FRAME_SKIP * model.num_timesteps / elapsed),
        "env_steps": model.num_timesteps,
        "updates": model._n_updates,
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    apexrl = apexrl_frames_per_s(args.seconds, Path(tempfile.mkdtemp()))
    sb3 = sb3_frames_per_s(args.seconds)
    print(json.dumps({
        "apexrl_impala": apexrl, "sb3_ppo_zoo": sb3,
        "frames_per_s_ratio": round(apexrl["frames_per_s"] / sb3["frames_per_s"], 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
