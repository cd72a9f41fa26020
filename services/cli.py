"""`apexrl <command> [flags]`: one entry point for every service.

Local mode, containers and Kubernetes all start the services through these commands.
"""

import asyncio
import dataclasses
import functools
import sys

from apexrl import config as cfg
from apexrl.common.serving import configure_logging, new_registry, run_worker, serve


def _setup(cls, argv: list[str], section: str):
    registry = None
    if any(f.name == "algorithm" for f in dataclasses.fields(cls)):
        from apexrl import algorithms  # torch-free; the replay never imports it

        registry = algorithms.REGISTRY
    config = cfg.parse(cls, argv, section, f"apexrl {section}", registry)
    configure_logging(config.log_level)
    return config, new_registry()


def _refuse(section: str, err: ValueError) -> None:
    """Exit 2 (a usage error, as argparse's) with the message that names the setting."""
    print(f"apexrl {section}: error: {err}", file=sys.stderr)
    sys.exit(2)


def _serve(config, build, section: str, registry) -> None:
    try:
        service, _ = build(config, registry)
        asyncio.run(serve(config, service, registry))
    except ValueError as err:  # a setting that can never work: say which, exit 2
        _refuse(section, err)


def _work(config, run, section: str, registry) -> None:
    try:
        run_worker(config, registry, lambda stop: run(config, registry, stop))
    except ValueError as err:  # a setting that can never work, or that the learner's refutes
        _refuse(section, err)


def replay(argv: list[str]) -> None:
    from apexrl.replay import server

    config, registry = _setup(cfg.ReplayConfig, argv, "replay")
    _serve(config, server.build, "replay", registry)


def learner(argv: list[str]) -> None:
    from apexrl.learner import server

    config, registry = _setup(cfg.LearnerConfig, argv, "learner")
    _serve(config, server.build, "learner", registry)


def actor(argv: list[str]) -> None:
    from apexrl.actor import loop

    config, registry = _setup(cfg.ActorConfig, argv, "actor")
    try:
        metrics = loop.register_metrics(config, registry)
    except ValueError as err:  # an unknown algorithm
        _refuse("actor", err)
    _work(config, functools.partial(loop.run, metrics=metrics), "actor", registry)


def evaluator(argv: list[str]) -> None:
    from apexrl.evaluator import loop

    config, registry = _setup(cfg.EvaluatorConfig, argv, "evaluator")
    metrics = loop.EvaluatorMetrics(registry)
    _work(config, functools.partial(loop.run, metrics=metrics), "evaluator", registry)


def local(argv: list[str]) -> None:
    from apexrl import local as local_mode

    sys.exit(local_mode.main(argv))


def evaluate(argv: list[str]) -> None:
    from apexrl import play

    sys.exit(play.main(argv))


COMMANDS = {
    "local": (local, "run replay, learner, actors and evaluator as processes on loopback"),
    "replay": (replay, "prioritized experience replay server"),
    "learner": (learner, "trains the algorithm from replay, serves parameters to actors"),
    "actor": (actor, "acts in gymnasium envs, inserts the algorithm's items into replay"),
    "evaluator": (evaluator, "plays the newest parameters greedily, reports returns"),
    "eval": (evaluate, "plays a learner checkpoint greedily and prints the returns"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        lines = [f"  {name:<10} {help}" for name, (_, help) in COMMANDS.items()]
        usage = "usage: apexrl <command> [flags]   (apexrl <command> --help: its flags)\n\n"
        print(usage + "commands:\n" + "\n".join(lines), file=sys.stdout if asked else sys.stderr)
        sys.exit(0 if asked else 2)
    command, _ = COMMANDS[argv[0]]
    command(argv[1:])


if __name__ == "__main__":
    main()
