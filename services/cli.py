"""`apexrl <command> [flags]`: one entry point for every service.

Local mode, containers and Kubernetes all start the services through these commands.
"""

import dataclasses
import functools
import os
import sys

# numpy's OpenBLAS runs a thread per core whose workers spin between calls: an actor acting
# on an MLP in numpy (a few small products a step) then kept 1.25 cores busy, starving the
# learner on a 2-core machine. One process, one core (torch's threads are the `threads`
# setting); set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from apexrl.common.memory import limit_malloc_arenas  # noqa: E402

limit_malloc_arenas()  # before any thread starts

from apexrl import config as cfg  # noqa: E402


def _setup(cls, argv: list[str], section: str):
    # Imported here: grpc costs `apexrl local`, `eval` and `plot` start-up time they never use.
    from apexrl.common.serving import configure_logging, new_registry

    registry = None
    if any(f.name == "algorithm" for f in dataclasses.fields(cls)):
        from apexrl import algorithms  # torch-free; the replay never imports it

        registry = algorithms.REGISTRY
    try:
        config = cfg.parse(cls, argv, section, f"apexrl {section}", registry)
    except ValueError as err:  # a table in the config file that can never work
        _refuse(section, err)
    configure_logging(config.log_level)
    return config, new_registry()


def _refuse(section: str, err: ValueError) -> None:
    """Exit 2 (a usage error, as argparse's) with the message that names the setting."""
    print(f"apexrl {section}: error: {err}", file=sys.stderr)
    sys.exit(2)


def _serve(config, build, section: str, registry) -> None:
    import asyncio

    from apexrl.common.serving import serve

    try:
        service, _ = build(config, registry)
        asyncio.run(serve(config, service, registry))
    except ValueError as err:  # a setting that can never work: say which, exit 2
        _refuse(section, err)


def _work(config, run, section: str, registry) -> None:
    from apexrl.common.serving import run_worker

    try:
        run_worker(config, registry, lambda stop: run(config, registry, stop))
    except ValueError as err:  # a setting that can never work, or that the learner's refutes
        _refuse(section, err)


def replay(argv: list[str]) -> None:
    from apexrl.replay import server

    config, registry = _setup(cfg.ReplayConfig, argv, "replay")
    _serve(config, server.build, "replay", registry)


def _tensorboard(config, registry, section: str, prefix: str, step: str):
    """The service's metrics as TensorBoard scalars when --tensorboard is set (else None)."""
    if not config.tensorboard:
        return None
    from apexrl.common.tensorboard import RegistryScalars

    try:
        return RegistryScalars(registry, config.tensorboard, prefix, step, section).start()
    except ValueError as err:  # no writer installed, or a folder that cannot be written
        _refuse(section, err)


def learner(argv: list[str]) -> None:
    from apexrl.learner import server

    config, registry = _setup(cfg.LearnerConfig, argv, "learner")
    scalars = _tensorboard(
        config, registry, "learner", "apexrl_learner_", "apexrl_learner_update_step"
    )
    try:
        _serve(config, server.build, "learner", registry)
    finally:
        if scalars is not None:
            scalars.close()


def relay(argv: list[str]) -> None:
    import asyncio

    from apexrl.common.serving import serve
    from apexrl.relay import server

    config, registry = _setup(cfg.RelayConfig, argv, "relay")
    try:
        service, relay = server.build(config, registry)
        asyncio.run(serve(config, service, registry, relay.stop))
    except ValueError as err:  # a setting that can never work (TLS files): say which, exit 2
        _refuse("relay", err)
    if relay.error is not None:  # a loop of relays: it can never serve
        _refuse("relay", relay.error)


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
    scalars = _tensorboard(
        config, registry, "evaluation", "apexrl_evaluation_", "apexrl_evaluation_parameter_version"
    )
    try:
        _work(config, functools.partial(loop.run, metrics=metrics), "evaluator", registry)
    finally:
        if scalars is not None:
            scalars.close()


def local(argv: list[str]) -> None:
    from apexrl.local.run import main

    sys.exit(main(argv))


def pbt(argv: list[str]) -> None:
    from apexrl.pbt.run import main

    sys.exit(main(argv))


def evaluate(argv: list[str]) -> None:
    from apexrl import play

    sys.exit(play.main(argv))


def pretrain(argv: list[str]) -> None:
    from apexrl import pretrain as cloning

    sys.exit(cloning.main(argv))


def tables(argv: list[str]) -> None:
    from apexrl import replay_tables

    replay_tables.main(argv)


def set_settings(argv: list[str]) -> None:
    from apexrl import live

    sys.exit(live.main(argv))


def plot(argv: list[str]) -> None:
    from apexrl import plot as plotting

    sys.exit(plotting.main(argv))


COMMANDS = {
    "local": (local, "run replay, learner, actors and evaluator as processes on loopback"),
    "pbt": (pbt, "population-based training: local runs, the worst go on from the best"),
    "replay": (replay, "prioritized experience replay server"),
    "learner": (learner, "trains the algorithm from replay, serves parameters to actors"),
    "relay": (relay, "pulls each parameter version from the learner once, serves it to actors"),
    "actor": (actor, "acts in gymnasium envs, inserts the algorithm's items into replay"),
    "evaluator": (evaluator, "plays the newest parameters greedily, reports returns"),
    "eval": (evaluate, "plays a learner checkpoint greedily and prints the returns"),
    "pretrain": (pretrain, "behaviour cloning from demonstrations, to a learner checkpoint"),
    "tables": (tables, "a config file's [[replay.tables]], from its algorithm's settings"),
    "plot": (plot, "overlays local-mode runs' learning curves in one PNG"),
    "set": (set_settings, "changes settings of a running learner (learning_rate=1e-4 ...)"),
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
    if argv[0] in SERVICES:
        _exit_now()


SERVICES = ("replay", "learner", "relay", "actor", "evaluator")


def _exit_now() -> None:
    """A service has stopped (what it had to finish is finished, its last line logged): the
    process ends here, without the interpreter's teardown of torch and grpc, which took up to
    seconds on a busy 2-core machine (tests/e2e/test_prompt_stops.py times every exit)."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
