"""Every algorithm the registry holds is named where a reader looks for the list: the layers
and layout of docs/architecture.md, and the `--algorithm` help of every command that takes one
(the help string argparse prints, as `apexrl <command> --help` builds it)."""

import dataclasses
import re
from pathlib import Path

import pytest

from apexrl import algorithms, command_config, config

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
ALGORITHM_FOLDERS = sorted(
    path.parent.name for path in (REPO / "services" / "algorithms").glob("*/builder.py")
)
COMMANDS = {
    "local": command_config.LocalConfig,
    "pbt": command_config.PbtConfig,
    "learner": config.LearnerConfig,
    "actor": config.ActorConfig,
    "evaluator": config.EvaluatorConfig,
}


def unnamed(names, text: str) -> list[str]:
    """The names that text never mentions as a word."""
    return [name for name in names if not re.search(rf"\b{re.escape(name)}\b", text)]


def algorithm_help(cls: type, prog: str) -> str:
    """The help of --algorithm in the parser the command builds."""
    parser = config.build_parser(cls, prog)
    (action,) = [a for a in parser._actions if a.dest == "algorithm"]
    return action.help


def test_every_command_that_takes_an_algorithm_is_checked():
    takes_one = {
        cls.__name__
        for module in (config, command_config)
        for cls in vars(module).values()
        if dataclasses.is_dataclass(cls)
        and cls.__module__ == module.__name__
        and "Config" in cls.__name__
        and cls is not config.AgentConfig
        and any(f.name == "algorithm" for f in dataclasses.fields(cls))
    }
    assert takes_one == {cls.__name__ for cls in COMMANDS.values()}


def test_every_algorithm_folder_is_registered():
    registered_folders = {path.split(".")[2] for path in algorithms.ALGORITHMS.values()}
    assert set(ALGORITHM_FOLDERS) == registered_folders


def test_architecture_names_every_algorithm():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    for section in ("## Layers", "## Layout"):
        body = text[text.index(section) :].split("\n## ")[0]
        missing = unnamed(sorted({*algorithms.ALGORITHMS, *ALGORITHM_FOLDERS}), body)
        assert not missing, f"docs/architecture.md, {section[3:]}: {missing} not named"


@pytest.mark.parametrize("command", COMMANDS)
def test_the_algorithm_help_names_every_algorithm(command: str):
    text = algorithm_help(COMMANDS[command], f"apexrl {command}")
    missing = unnamed(algorithms.ALGORITHMS, text)
    assert not missing, f"apexrl {command} --help: --algorithm names none of {missing}: {text!r}"


def test_the_check_finds_a_missing_name():
    assert unnamed(["dqn", "r2d2", "ppo"], "dqn or dqn2 (r2d2's cousin)") == ["ppo"]


@pytest.mark.parametrize(
    "name, message",
    [
        ("apexrl_no_such_module:Builder", "algorithm: 'apexrl_no_such_module:Builder' cannot be"),
        ("apexrl.algorithms:NoSuchBuilder", "algorithm: 'apexrl.algorithms:NoSuchBuilder' cannot"),
        ("apexrl.algorithms:ALGORITHMS", "algorithm: 'apexrl.algorithms:ALGORITHMS' is a dict"),
        ("no_such_name", "algorithm: 'no_such_name', expected one of"),
        ("apexrl.algorithms:get", "algorithm: 'apexrl.algorithms:get' is not a Builder subclass"),
    ],
)
def test_an_algorithm_that_cannot_be_imported_is_refused_naming_the_setting(name, message):
    with pytest.raises(ValueError) as refused:
        algorithms.get(name)
    assert str(refused.value).startswith(message), refused.value
