"""apexrl pretrain: behaviour cloning alone. Trains the algorithm's policy on a folder of
demonstrations as the learner does before its first version (learner/pretraining.py), and
writes a learner checkpoint to checkpoint_dir: `apexrl eval --checkpoint DIR` plays it, and a
learner started on the same checkpoint_dir goes on from it. It reads the learner's settings
(its [learner] table and flags): one file drives both."""

import logging
import sys

from apexrl import config as cfg

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    import torch

    from apexrl import algorithms
    from apexrl.learner import checkpoint, pretraining
    from apexrl.learner.device import pick_device

    try:
        config = cfg.parse(
            cfg.LearnerConfig, argv, "learner", "apexrl pretrain", algorithms.REGISTRY
        )
        for name in ("pretrain_demonstrations", "checkpoint_dir"):
            if not getattr(config, name):
                raise ValueError(f"{name}: required (--{name.replace('_', '-')} DIR)")
        builder = algorithms.make(config)
        pairs = pretraining.demonstration_pairs(config, builder.spec)
    except ValueError as err:  # refused before anything is trained or written
        print(f"apexrl pretrain: error: {err}", file=sys.stderr)
        return 2
    assert pairs is not None
    observations, actions = pairs
    logging.basicConfig(level=config.log_level, format="%(message)s")
    torch.set_num_threads(config.threads)
    if config.seed:
        torch.manual_seed(config.seed)
    device = pick_device(config.device)
    learning = builder.learning(config, device)
    try:
        figures = pretraining.clone(learning, observations, actions, config, device)
    except ValueError as err:  # an algorithm with no policy to clone
        print(f"apexrl pretrain: error: {err}", file=sys.stderr)
        return 2
    counters = {"update_step": 0, "version": 1, "samples_consumed": 0}
    checkpoint.save(config, builder.name, learning, counters)
    print(
        f"{builder.name} on {config.env}: {config.pretrain_steps} steps on {len(actions)} pairs"
        f" of {config.pretrain_demonstrations}: loss {figures['loss']:.4f}, accuracy"
        f" {figures['accuracy']:.3f}; checkpoint in {config.checkpoint_dir} (play it: apexrl"
        f" eval --checkpoint {config.checkpoint_dir})"
    )
    return 0
