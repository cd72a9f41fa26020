"""`apexrl <service> [flags]`: one entry point for every service, in local mode, containers and Kubernetes."""

import asyncio
import sys

import prometheus_client

from apexrl.common.serving import configure_logging, serve
from apexrl.config import ReplayConfig, parse


def replay(argv: list[str]) -> None:
    from apexrl.replay import server

    config = parse(ReplayConfig, argv, "replay", "apexrl replay")
    configure_logging(config.log_level)
    registry = prometheus_client.CollectorRegistry()
    try:
        service, _ = server.build(config, registry)
    except ValueError as err:  # a setting that can never work: say which, exit 2
        sys.exit(f"apexrl replay: error: {err}")
    asyncio.run(serve(config, service, registry))


COMMANDS = {
    "replay": (replay, "prioritized experience replay server"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {help}" for name, (_, help) in COMMANDS.items()]
        usage = "usage: apexrl <command> [flags]   (apexrl <command> --help for its flags)\n\ncommands:\n"
        print(
            usage + "\n".join(lines),
            file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout,
        )
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, _ = COMMANDS[argv[0]]
    command(argv[1:])


if __name__ == "__main__":
    main()
