"""The learner's CUDA path in one short script: prints figures, asserts nothing.

    .venv/bin/python benchmarks/gpu_check.py     # on a machine with an NVIDIA GPU

Builds the learner on --device auto and prints one JSON line per batch shape (CartPole and
Atari): device, and whether the CUDA result matches the CPU result on the same batch (same
weights, same step), and two rates:
- learner_updates_per_s, the headline: what the learner's training thread does per update,
  through its own code (Learner.to_device and Learner._update): copy a sampled batch from host
  memory to the device, the double-DQN step, new priorities back to the host (a sync), target
  sync and publishing at their intervals.
- ceiling_updates_per_s: the SGD step alone on a batch already on the device, no per-update
  sync: a ceiling, not what the learner reaches.
"""

import json
import queue
import time

import numpy as np
import prometheus_client
import torch

from apexrl.algorithms.dqn.losses import dqn_loss
from apexrl.algorithms.dqn.networks import build_network
from apexrl.algorithms.networks import load_numpy_state, state_to_numpy
from apexrl.config import LearnerConfig
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.parameters import ParameterStore
from apexrl.learner.training import Learner, pick_device
from apexrl.replay.client import SampledBatch


def batch(shape, dtype, size, device):
    rng = np.random.default_rng(0)
    make = (lambda s: rng.integers(0, 255, s, dtype=np.uint8)) if dtype == np.uint8 else (
        lambda s: rng.normal(size=s).astype(np.float32))  # fmt: skip
    columns = {"obs": make((size, *shape)), "next_obs": make((size, *shape)),
               "action": rng.integers(0, 2, size), "reward": np.ones(size, np.float32),
               "discount": np.full(size, 0.97, np.float32)}  # fmt: skip
    return {k: torch.from_numpy(v).to(device) for k, v in columns.items()}


def learner_updates_per_s(device, shape, dtype, size, seconds=3.0) -> float:
    """Updates/s of the learner's own per-update path, from host-memory batches."""
    config = LearnerConfig(env="CartPole-v1", device=str(device), threads=torch.get_num_threads())
    learner = Learner(
        config, LearnerMetrics(prometheus_client.CollectorRegistry()), ParameterStore()
    )
    if shape != (4,):  # another observation shape: the same learner with networks for it
        learner.online, learner.target = (
            build_network(shape, dtype, 2).to(device) for _ in range(2)
        )
        learner.optimizer = torch.optim.Adam(learner.online.parameters(), lr=1e-3)
    host = {k: v.numpy() for k, v in batch(shape, dtype, size, "cpu").items()}
    sampled = SampledBatch(columns=host, keys=np.arange(size), probabilities=np.ones(size),
                           weights=np.ones(size, np.float32), table_size=size)  # fmt: skip
    priorities: queue.Queue = queue.Queue()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        learner._update(*learner.to_device(sampled), priorities)
        priorities.get_nowait()  # the writer thread's job; here only emptied
        done += 1
    return done / (time.perf_counter() - started)


def updates_per_s(device, shape, dtype, size, seconds=3.0):
    online, target = (build_network(shape, dtype, 2).to(device) for _ in range(2))
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-3)
    data, weights = batch(shape, dtype, size, device), torch.ones(size, device=device)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        loss, _, _ = dqn_loss(online, target, data, weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return done / (time.perf_counter() - started)


def same_step_on_cpu_and(device, shape, dtype, size) -> float:
    """Largest |difference| of the TD errors of one update computed on CPU and on `device`."""
    cpu_net, cpu_target = build_network(shape, dtype, 2), build_network(shape, dtype, 2)
    dev_net, dev_target = (
        build_network(shape, dtype, 2).to(device),
        build_network(shape, dtype, 2).to(device),
    )
    load_numpy_state(dev_net, state_to_numpy(cpu_net))
    load_numpy_state(dev_target, state_to_numpy(cpu_target))
    _, td_cpu, _ = dqn_loss(cpu_net, cpu_target, batch(shape, dtype, size, "cpu"), torch.ones(size))
    _, td_dev, _ = dqn_loss(
        dev_net, dev_target, batch(shape, dtype, size, device), torch.ones(size, device=device)
    )
    return float((td_cpu - td_dev.cpu()).abs().max())


def main() -> None:
    device = pick_device("auto")
    for name, shape, dtype, size in (
        ("cartpole", (4,), np.float32, 256),
        ("atari", (84, 84, 4), np.uint8, 32),
    ):
        print(json.dumps({
            "shape": name, "device": str(device),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "learner_updates_per_s": round(learner_updates_per_s(device, shape, dtype, size), 1),
            "ceiling_updates_per_s": round(updates_per_s(device, shape, dtype, size), 1),
            "max_td_difference_vs_cpu": same_step_on_cpu_and(device, shape, dtype, size),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
