"""`apexrl set NAME=VALUE ...`: changes settings of a running learner through its SetSetting
RPC (which settings can change, and how the learner applies them: learner/scheduled.py).
Each change is sent in the order given; the first one refused stops the rest."""

import sys

from apexrl import config as cfg
from apexrl.command_config import SetConfig

PROG = "apexrl set"


def changes(words: list[str]) -> list[tuple[str, float]]:
    """NAME=VALUE words as (name, value); ValueError naming the word for any other."""
    parsed = []
    for word in words:
        name, _, text = word.partition("=")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{word}: needs NAME=NUMBER, got {text!r} after the =") from None
        if not name:
            raise ValueError(f"{word}: needs a setting's name before the =")
        parsed.append((name, value))
    if not parsed:
        raise ValueError("no NAME=VALUE given (e.g. learning_rate=1e-4)")
    return parsed


def main(argv: list[str]) -> int:
    words = [a for a in argv if "=" in a and not a.startswith("-")]
    config = cfg.parse(SetConfig, [a for a in argv if a not in words], "set", PROG)
    try:
        wanted = changes(words)
    except ValueError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    import grpc

    from apexrl.common.learner_client import LearnerClient

    with LearnerClient(
        config.learner, timeout=config.timeout, retry_seconds=0, tls=config
    ) as client:
        for name, value in wanted:
            try:
                answer = client.set_setting(name, value)
            except grpc.RpcError as err:
                print(f"{PROG}: {err.code().name}: {err.details()}", file=sys.stderr)
                return 1
            print(f"{name} = {value:g} from update {answer.update_step} (was {answer.previous:g})")
    return 0
