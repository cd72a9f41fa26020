"""The Atari learner's step per CPU-second: what memory layout, precision and compilation buy.

    .venv/bin/python benchmarks/learner_step.py                  # dqn on Pong, batch 32
    .venv/bin/python benchmarks/learner_step.py --batch-size 512 --rounds 5

The learner's own update (Learner._update: dqn's double-DQN loss, Adam, priorities, metrics)
on random Pong-shaped batches, one torch thread, in each variant:

- float32 / bfloat16: `precision` (bfloat16 is autocast, Atari's `auto` on CPUs with
  AVX-512 BF16 or AMX);
- channels_last: the online and target networks' weights and the batch's frames in
  torch.channels_last (NHWC), the layout oneDNN's convolutions prefer;
- compiled: the online and target networks through torch.compile (its compile time printed
  apart, not in the rate).

In process, on a batch already in memory (no replay, gRPC or decode): a ceiling per variant,
to compare the variants side by side, not a learner's rate. Rates are updates per CPU-second of the timing thread (time.thread_time: the one torch thread
does the work), so a machine busy with other work reads close to an idle one; the variants
take turns, `--rounds` times, and each rate is the median of its rounds. One JSON object.
"""

import argparse
import json
import os
import queue
import statistics
import time

import numpy as np
import torch

from apexrl import algorithms
from apexrl.common.parameters import ParameterStore
from apexrl.config import LearnerConfig
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner


def learner(precision: str, batch_size: int) -> Learner:
    import prometheus_client

    config = LearnerConfig(
        env="ALE/Pong-v5", device="cpu", batch_size=batch_size, precision=precision
    )
    builder = algorithms.make(config)
    metrics = LearnerMetrics(
        prometheus_client.CollectorRegistry(), builder.metrics.figures, builder.metrics.loss_help
    )
    return Learner(config, builder, metrics, ParameterStore())


def batch(n: int, channels_last: bool) -> dict[str, torch.Tensor]:
    frames = [torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8) for _ in range(2)]
    if channels_last:
        frames = [f.contiguous(memory_format=torch.channels_last) for f in frames]
    return {
        "obs": frames[0],
        "next_obs": frames[1],
        "action": torch.randint(0, 6, (n,)),
        "reward": torch.zeros(n),
        "discount": torch.full((n,), 0.97),
    }


def variant(precision: str, channels_last: bool, compiled: bool, batch_size: int):
    """A learner in the variant and a callable doing one update; the compile time (s)."""
    made = learner(precision, batch_size)
    learning = made.learning
    if channels_last:
        learning.online.to(memory_format=torch.channels_last)
        learning.target.to(memory_format=torch.channels_last)
    compile_seconds = 0.0
    if compiled:
        learning.online = torch.compile(learning.online)
        learning.target = torch.compile(learning.target)
    columns = batch(batch_size, channels_last)
    weights, keys, sink = torch.ones(batch_size), np.arange(batch_size), queue.Queue()

    def update() -> None:
        made._update(columns, weights, keys, sink)
        while not sink.empty():
            sink.get()

    started = time.perf_counter()
    update()  # warm-up (and the compilation)
    if compiled:
        compile_seconds = time.perf_counter() - started
    update()
    return update, compile_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--updates", type=int, default=10, help="updates per timing")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names, updates, compile_seconds = [], {}, {}
    for precision in ("float32", "bfloat16"):
        for channels_last in (False, True):
            for compiled in (False, True) if not args.no_compile else (False,):
                name = precision + ("_channels_last" if channels_last else "")
                name += "_compiled" if compiled else ""
                names.append(name)
                updates[name], seconds = variant(
                    precision, channels_last, compiled, args.batch_size
                )
                if compiled:
                    compile_seconds[name] = round(seconds, 1)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            started = time.thread_time()
            for _ in range(args.updates):
                updates[name]()
            rates[name].append(args.updates / (time.thread_time() - started))
    medians = {name: round(statistics.median(r), 1) for name, r in rates.items()}
    print(
        json.dumps(
            {
                "batch_size": args.batch_size,
                "updates_per_cpu_s": medians,
                "relative_to_bfloat16": {
                    name: round(v / medians["bfloat16"], 3) for name, v in medians.items()
                },
                "compile_seconds": compile_seconds,
                "load_1min": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
