"""apexrl eval: plays a learner checkpoint (by default the best model) greedily and prints the
returns."""

import dataclasses
import sys
from pathlib import Path

from apexrl import config as cfg
from apexrl.command_config import EvalConfig


def saved_agent(saved: dict) -> cfg.AgentConfig:
    """The agent settings a checkpoint was trained with (its algorithm's settings included)."""
    from apexrl import algorithms

    saved = {"algorithm": "dqn"} | saved  # checkpoints from before the algorithm layer
    # Not the potential: eval plays the env's own rewards, so its module need not be here.
    names = {f.name for f in dataclasses.fields(cfg.AgentConfig)} - {"algo", "reward_potential"}
    agent = cfg.AgentConfig(**{k: v for k, v in saved.items() if k in names})
    settings_class = algorithms.get(agent.algorithm).Settings
    known = {f.name for f in dataclasses.fields(settings_class)}
    agent.algo = settings_class(
        **{k: v for k, v in (saved.get("algo") or {}).items() if k in known}
    )
    return agent


def main(argv: list[str]) -> int:
    """apexrl eval --checkpoint PATH: plays a saved policy greedily (by default the best model)."""
    from apexrl import algorithms
    from apexrl.algorithms import demonstrations
    from apexrl.algorithms.base import prefixed
    from apexrl.algorithms.envs import EnvOptions
    from apexrl.algorithms.evaluation import evaluate

    config = cfg.parse(EvalConfig, argv, "eval", "apexrl eval")
    if config.episodes < 1:
        return _refuse(f"episodes: must be >= 1, got {config.episodes}")
    path, meta, arrays = _checkpoint(Path(config.checkpoint), config.latest)
    agent = saved_agent(meta["config"])
    options = EnvOptions.of(agent)
    if config.video and config.record:
        return _refuse("record: one of video and record at a time")
    folder = None
    try:  # refused before the policy is built: nothing made, nothing written
        if config.video:
            from apexrl.algorithms import video

            folder = video.prepare(agent.env, options, config.video)
        if config.record:
            folder = demonstrations.prepare(config.record)
    except ValueError as err:
        return _refuse(err)
    builder = algorithms.make(agent)
    policy = builder.policy()
    policy.load(prefixed(arrays, "online"))
    videos: list[tuple[Path, int]] = []
    if folder is None:
        returns = evaluate(policy, agent.env, config.episodes, config.seed, config.epsilon, options)
    elif config.record:
        returns, _ = demonstrations.record(
            policy, builder.spec, config.episodes, config.seed, config.epsilon, options, folder
        )
    else:
        returns, videos = video.record_episodes(
            policy,
            agent.env,
            config.episodes,
            config.seed,
            config.epsilon,
            options,
            folder,
            meta["version"],
        )
    what = f"{path}: {agent.env}, version {meta['version']} (update {meta['update_step']})"
    if "mean_return" in meta:  # a best model: say what earned it
        p = meta["protocol"]
        what += (
            f", the best model: scored {meta['mean_return']:.1f} over {p['episodes']}"
            f" evaluator episodes (seeds {p['first_seed']}..)"
        )
    print(what)
    print(f"seeds {config.seed}..{config.seed + config.episodes - 1}, epsilon {config.epsilon:g}")
    print("returns: " + " ".join(f"{r:g}" for r in returns))
    print(
        f"mean {returns.mean():.1f}, min {returns.min():g}, max {returns.max():g}"
        f" over {len(returns)} episodes"
    )
    for recorded, steps in videos:
        print(f"video: {recorded} ({steps} steps)")
    if config.record:
        print(f"demonstrations: {len(returns)} episodes in {config.record} (index.json)")
    return 0


def _checkpoint(path: Path, latest: bool) -> tuple[Path, dict, dict]:
    """(path, meta, arrays) of a checkpoint file, or of a directory's best model (its newest
    learner checkpoint with `latest`, or when it holds no best model)."""
    from apexrl.common import checkpoint
    from apexrl.learner.best import KIND as BEST

    if not path.is_dir():
        kind = BEST if path.name.startswith(f"{BEST}-") else "learner"
        return (path, *checkpoint.read_checkpoint(path, kind))
    kinds = ["learner"] if latest else [BEST, "learner"]
    found = next(filter(None, (checkpoint.load_newest(path, k) for k in kinds)), None)
    if found is None:
        sys.exit(f"apexrl eval: no valid checkpoint ({' or '.join(kinds)}) in {path}")
    return found


def _refuse(message) -> int:
    """A usage error, as argparse's: one line naming the setting, exit 2."""
    print(f"apexrl eval: error: {message}", file=sys.stderr)
    return 2
