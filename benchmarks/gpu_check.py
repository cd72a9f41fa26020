"""The learner's device path in one short script: prints figures, asserts nothing.

    .venv/bin/python benchmarks/gpu_check.py     # on a machine with an NVIDIA GPU (or CPU)

Builds the learner on --device auto through its own code, for CartPole (MLP, batch 256) and
Atari (ALE/Pong-v5: Nature CNN, batch 512, compressed frames; in float32 and again with
precision bfloat16), and prints one JSON line each:
- input_batches_per_s: the input pipeline alone (Learner.to_device: zstd frames decompressed,
  pinned memory and the copy to the device on CUDA), what the prefetch thread does per batch;
- learner_updates_per_s, the headline: the training thread's per-update work
  (Learner._update on a batch already decoded: the double-DQN step, new priorities back to
  the host, a sync, target syncs and publishing at their intervals);
- max_td_difference_vs_cpu: the same update's TD errors on the device and on the CPU.
The last line is one JSON object: gpu_learner_updates_per_s (Atari, batch 512, at the
precision local mode's Atari default `auto` picks on that device) and the rest.
"""

import json
import queue
import time
from functools import partial

import numpy as np
import prometheus_client
import torch

from apexrl import algorithms
from apexrl.algorithms.columns import pack
from apexrl.algorithms.networks import load_numpy_state, state_to_numpy
from apexrl.common.parameters import ParameterStore
from apexrl.config import LearnerConfig
from apexrl.learner.device import native_bfloat16, pick_device
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner
from apexrl.replay.client import SampledBatch


def sampled_batch(algorithm, size: int) -> SampledBatch:
    """A batch as replay would return it: the algorithm's columns, frames compressed."""
    rng = np.random.default_rng(0)
    spec = algorithm.spec
    if spec.obs_dtype == np.uint8:  # game-like frames: background with a few bright pixels
        obs = ((rng.random((size, *spec.obs_shape)) < 0.02) * 200).astype(np.uint8)
    else:
        obs = rng.normal(size=(size, *spec.obs_shape)).astype(np.float32)
    fields = {
        "obs": obs,
        "action": rng.integers(0, spec.num_actions, size),
        "reward": np.ones(size, np.float32),
        "discount": np.full(size, 0.97, np.float32),
        "next_obs": np.roll(obs, 1, axis=0),
    }
    return SampledBatch(pack(fields, algorithm.columns()), np.arange(size),
                        np.full(size, 1 / size), np.ones(size, np.float32), size)  # fmt: skip


def learner_for(env: str, device: torch.device, size: int, precision: str = "float32") -> Learner:
    # One CPU thread per process is what the services use on CPU (threads oversubscribed on a
    # busy machine slow torch down several times); a GPU learner's CPU threads matter little.
    threads = torch.get_num_threads() if device.type == "cuda" else 1
    config = LearnerConfig(
        env=env, device=str(device), batch_size=size, threads=threads, precision=precision
    )
    builder = algorithms.make(config)
    # The algorithm's figures as gauges, as the learner's server registers them.
    metrics = LearnerMetrics(
        prometheus_client.CollectorRegistry(), builder.metrics.figures, builder.metrics.loss_help
    )
    return Learner(config, builder, metrics, ParameterStore())


def rate(fn, seconds: float, sync) -> float:
    fn()  # warm-up (cuDNN autotuning, allocations)
    sync()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn()
        done += 1
    sync()
    return done / (time.perf_counter() - started)


def td_difference_vs_cpu(learner: Learner, cpu: Learner, sampled: SampledBatch) -> float:
    """Largest |difference| of one update's TD errors on the learner's device (at its
    precision) and on the CPU in float32, from the same weights and batch."""
    for source, target in ((learner.learning.online, cpu.learning.online),
                           (learner.learning.target, cpu.learning.target)):  # fmt: skip
        load_numpy_state(target, state_to_numpy(source))
    with learner.autocast():
        td_device, _ = learner.learning.update(*learner.to_device(sampled)[:2], 1)
    td_cpu, _ = cpu.learning.update(*cpu.to_device(sampled)[:2], 1)
    return float((td_device.cpu() - td_cpu).abs().max())


def main(seconds: float = 5.0) -> None:
    device = pick_device("auto")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    figures = {"device": str(device)}
    if device.type == "cuda":
        figures["cuda"] = torch.cuda.get_device_name(0)
    for name, env, size, precision in (
        ("cartpole", "CartPole-v1", 256, "float32"),
        ("atari", "ALE/Pong-v5", 512, "float32"),
        ("atari_bfloat16", "ALE/Pong-v5", 512, "bfloat16"),
    ):
        learner = learner_for(env, device, size, precision)
        sampled = sampled_batch(learner.builder, size)
        item = learner.to_device(sampled)
        priorities: queue.Queue = queue.Queue()

        def update(learner=learner, item=item, priorities=priorities):
            learner._update(*item, priorities)
            priorities.get_nowait()  # the writer thread's job; here only emptied

        line = {
            "shape": name,
            "batch": size,
            "precision": precision,
            "input_batches_per_s": round(rate(partial(learner.to_device, sampled), seconds, sync), 1),
            "learner_updates_per_s": round(rate(update, seconds, sync), 1),
            "max_td_difference_vs_cpu": td_difference_vs_cpu(
                learner, learner_for(env, torch.device("cpu"), size), sampled
            ),
        }  # fmt: skip
        print(json.dumps(line), flush=True)
        figures[f"{name}_learner_updates_per_s"] = line["learner_updates_per_s"]
        figures[f"{name}_input_batches_per_s"] = line["input_batches_per_s"]
    # The headline is what Atari's local-mode default (precision auto) runs on this device.
    best = "atari_bfloat16" if native_bfloat16(device) else "atari"
    key = "gpu_learner_updates_per_s" if device.type == "cuda" else "cpu_learner_updates_per_s"
    figures[key] = figures[f"{best}_learner_updates_per_s"]
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
