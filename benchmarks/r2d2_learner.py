"""R2D2's learner speed: sequence-steps per second (batch x sequence_length) of its update step.

    .venv/bin/python benchmarks/r2d2_learner.py                                  # masked CartPole
    .venv/bin/python benchmarks/r2d2_learner.py --env ALE/Pong-v5 --paper        # Atari, 64 x 80

Builds R2D2's learning through its builder (local mode's presets for the env, or with --paper the
paper's: sequences of 80 with a burn-in of 40, an LSTM of 512, batches of 64) on --device (auto:
CUDA when present) with one torch thread, as the learner has by default (--threads), feeds it
random sequences already on the device, and prints one JSON line: updates per second and
sequence-steps per second (the paper's figure: 25,600 on one GPU). The burn-in steps are
counted, as the paper counts them. Prints figures, asserts nothing.
"""

import argparse
import json
import time

import numpy as np
import torch

from apexrl import algorithms
from apexrl.config import LearnerConfig

PAPER = {"sequence_length": 80, "sequence_period": 40, "burn_in": 40, "lstm_size": 512}


def random_batch(algorithm, size: int, device) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    batch = {}
    spec = algorithm.spec
    for column in algorithm.columns():
        shape = (size, *column.shape)
        if column.stack:  # frames stored once per step: the learner sees the stacks rebuilt
            shape = (size, column.shape[0] - spec.obs_shape[0] + 1, *spec.obs_shape)
        elif column.name.endswith("_starts"):
            continue
        if np.issubdtype(column.dtype, np.floating):
            values = rng.standard_normal(shape).astype(column.dtype)
        else:
            values = rng.integers(0, 2, shape).astype(column.dtype)
        batch[column.name] = torch.from_numpy(values).to(device)
    batch["mask"] = torch.ones_like(batch["mask"])
    batch["discounts"] = torch.full_like(batch["discounts"], 0.99)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="apexrl/CartPoleNoVelocity-v1")
    parser.add_argument("--paper", action="store_true", help="the paper's sizes, batch 64")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the learner's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    builder_class = algorithms.get("r2d2")
    presets = builder_class.presets(args.env)
    settings = builder_class.Settings(
        **{**presets.get("r2d2", {}), **(PAPER if args.paper else {})}
    )
    learner = {**presets.get("learner", {}), **({"batch_size": 64} if args.paper else {})}
    learner.pop("beta", None)
    config = LearnerConfig(algorithm="r2d2", env=args.env, algo=settings, **learner)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    algorithm = algorithms.make(config)
    learning = algorithm.learning(config, device)
    batch = random_batch(algorithm, config.batch_size, device)
    weights = torch.ones(config.batch_size, device=device)
    learning.update(batch, weights, 1)  # warm-up
    updates, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        updates += 1
        priorities, _ = learning.update(batch, weights, updates + 1)
        priorities.cpu()  # the learner sends them to the host
    elapsed = time.perf_counter() - started
    steps = config.batch_size * settings.sequence_length
    print(json.dumps({
        "env": args.env, "device": str(device), "batch_size": config.batch_size,
        "sequence_length": settings.sequence_length, "burn_in": settings.burn_in,
        "lstm_size": settings.lstm_size, "threads": torch.get_num_threads(),
        "updates_per_s": round(updates / elapsed, 2),
        "sequence_steps_per_s": round(updates * steps / elapsed),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
