"""Reading a config dataclass from defaults < config file < environment < flags (config.py
documents the layout). Torch-free and algorithm-free: the algorithm registry comes in as an
`Algorithms` value."""

import argparse
import dataclasses
import importlib
import os
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar


def option(
    default: Any,
    help: str,
    schedule: str = "",
    per_actor: str = "",
    within: tuple[float, float] | None = None,
) -> Any:
    """A config field with its documentation; `schedule`: a number that may change over a run,
    given a schedule (schedules.py) instead, over the steps it names ("updates": the
    learner's; "env steps": an actor's own); `per_actor`: an actor-side setting each actor may
    draw from a distribution (draws.py: "draw"; "ladder": a ladder too), its values `within`."""
    if schedule:
        help += f" (a number, or a schedule over {schedule}: docs/algorithms.md#schedules)"
    if per_actor:
        help += " (or drawn per actor: docs/algorithms.md#settings-drawn-per-actor)"
    metadata = {"help": help, "schedule": schedule, "per_actor": per_actor, "within": within}
    return field(default=default, metadata=metadata)


def file_option(help: str) -> Any:
    """A config field only a config file can set (a TOML array of tables): no flag, no env."""
    return field(default_factory=list, metadata={"help": help, "file_only": True})


T = TypeVar("T")


@dataclass(frozen=True)
class Scheduled:
    """The kind of a setting that takes a schedule (config.option(schedule=UNIT)): a number, or
    a schedule over UNIT (schedules.Schedule: a float whose value is its start) from its inline
    table or text."""

    unit: str

    def __call__(self, value: Any, name: str) -> float:
        from apexrl import schedules

        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and not value.strip().startswith("{"):
            return convert(value, float, name)
        return schedules.parse(value, name, self.unit)


@dataclass(frozen=True)
class PerActor:
    """The kind of a setting an actor may draw (config.option(per_actor=...)): its own kind
    (int, float or Scheduled), or a distribution (draws.Draw) from its inline table or text."""

    kind: Any
    ladder: bool  # it may take a ladder (it is read at each parameter pull)
    within: tuple[float, float] | None  # the range its values must keep to

    def __call__(self, value: Any, name: str) -> Any:
        from apexrl import draws

        if draws.shape_of(value) is None:
            if _table(value) and not (isinstance(self.kind, Scheduled) and _schedule(value)):
                shapes = draws.shapes(integer=self.kind is int, ladder=self.ladder)
                schedule = "a schedule, " if isinstance(self.kind, Scheduled) else ""
                raise ValueError(
                    f"{name}: a number, {schedule}or a per-actor distribution (one of"
                    f" {', '.join(shapes)}), got {value!r}"
                )
            return convert(value, self.kind, name)
        draw = draws.parse(value, name, integer=self.kind is int, ladder=self.ladder)
        if self.within and not all(self.within[0] <= v <= self.within[1] for v in draw.values):
            raise ValueError(f"{name}: must be in {list(self.within)}, got {draw.toml()}")
        return draw


def _table(value: Any) -> bool:
    """An inline table, or its text."""
    return isinstance(value, dict) or (isinstance(value, str) and value.strip().startswith("{"))


def _schedule(value: Any) -> bool:
    """An inline table (or its text) that names a schedule's shape."""
    from apexrl import schedules

    try:
        table = tomllib.loads(f"x = {value}")["x"] if isinstance(value, str) else value
    except tomllib.TOMLDecodeError:
        return True  # the schedule parser says what is wrong with the text
    return any(key in schedules.SHAPES for key in table)


def convert(value: Any, kind: Any, name: str) -> Any:
    if isinstance(kind, PerActor):
        return kind(value, name)
    if isinstance(value, dict | str):
        from apexrl import draws

        shape = draws.shape_of(value)
        if shape is not None:
            raise ValueError(
                f"{name}: takes no per-actor distribution ({shape}): only the actor-side"
                " settings whose help says so do (docs/algorithms.md#settings-drawn-per-actor)"
            )
    if isinstance(kind, Scheduled):
        return kind(value, name)
    if kind in (int, float) and (
        isinstance(value, dict) or (isinstance(value, str) and value.strip().startswith("{"))
    ):
        raise ValueError(
            f"{name}: cannot change during a run: a number, not a schedule (the settings that"
            " take one say so in their help)"
        )
    if kind is bool and isinstance(value, str):
        lowered = value.strip().lower()
        if lowered not in {"1", "0", "true", "false", "yes", "no"}:
            raise ValueError(f"{name}: expected a boolean, got {value!r}")
        return lowered in {"1", "true", "yes"}
    try:
        return kind(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}") from err


def import_callable(path: str, name: str) -> Callable[..., Any]:
    """The callable a setting names as "package.module:attribute" (ValueError naming the setting
    when it is not one, cannot be imported or is not callable)."""
    module, _, attribute = path.partition(":")
    if not module or not attribute:
        raise ValueError(f"{name}: expected 'package.module:function', got {path!r}")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{name}: {path!r} cannot be imported ({err})") from err
    if not callable(found):
        raise ValueError(f"{name}: {path!r} is a {type(found).__name__}, not a callable")
    return found


def env_name(name: str) -> str:
    return "APEXRL_" + name.upper()


SECTIONS = ("replay", "learner", "actor", "evaluator", "local", "eval", "pbt")


@dataclass(frozen=True)
class Algorithms:
    """What parse() needs of the algorithm registry (the config layer imports no algorithm)."""

    names: tuple[str, ...]  # the registered algorithms: their tables are algorithm tables
    settings: Any  # name -> (its table name, its Settings dataclass); ValueError if unknown


def _fields(cls: type) -> list:
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _add_flags(parser, fields: list) -> None:
    for f in fields:
        if f.metadata.get("file_only"):
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (env {env_name(f.name)})"
        if f.type is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
            )
        elif f.metadata.get("schedule") or f.metadata.get("per_actor"):  # parse() converts
            parser.add_argument(flag, default=f.default, help=help_text)
        else:
            parser.add_argument(flag, type=f.type, default=f.default, help=help_text)


def build_parser(
    cls: type, prog: str, settings: tuple[str, type] | None = None
) -> argparse.ArgumentParser:
    """The flags of cls, and of the algorithm's settings (table name, Settings) if given."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=cls.__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("APEXRL_CONFIG", ""),
        help="TOML config file: top-level keys, then this service's [table] (env APEXRL_CONFIG)",
    )
    file_only = [f for f in _fields(cls) if f.metadata.get("file_only")]
    if file_only:
        parser.epilog = "settings only a config file sets: " + "; ".join(
            f"{f.name}: {f.metadata['help']}" for f in file_only
        )
    _add_flags(parser, _fields(cls))
    if settings is not None:
        table, settings_class = settings
        shared = {f.name for f in _fields(cls)} & {f.name for f in _fields(settings_class)}
        if shared:
            raise ValueError(
                f"algorithm {table}: its setting {sorted(shared)[0]!r} is also a setting of"
                f" {prog}; an algorithm's settings need names of their own"
            )
        group = parser.add_argument_group(
            f"{table} settings", f"the config file's [{table}] table, or these flags"
        )
        _add_flags(group, _fields(settings_class))
    return parser


def _read_file(path: str) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def _algorithm_name(cls: type, argv: list[str], data: dict) -> str | None:
    """The algorithm a service runs, before its flags are parsed: flag, env, file, default."""
    default = {f.name: f.default for f in _fields(cls)}.get("algorithm")
    if default is None:
        return None
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--algorithm")
    flag = pre.parse_known_args(argv)[0].algorithm
    return flag or os.environ.get(env_name("algorithm")) or data.get("algorithm") or default


def _check_tables(
    data: dict, path: str, algorithms: Algorithms, table: str, others: dict[str, set]
) -> None:
    """Every table of the file is a service's or an algorithm's, and an algorithm's table holds
    only that algorithm's settings."""
    for name, value in data.items():
        if not isinstance(value, dict) or name in SECTIONS or name == table:
            continue
        if name not in algorithms.names:
            raise ValueError(
                f"{path}: unknown table [{name}]: neither a service ({', '.join(SECTIONS)}) nor"
                f" an algorithm ({', '.join(algorithms.names)})"
            )
        for key in value:
            if key not in others[name]:
                raise ValueError(f"{path}: [{name}] has unknown key {key!r}")


def parse(
    cls: type[T],
    argv: list[str] | None,
    section: str,
    prog: str,
    algorithms: Algorithms | None = None,
    presets: dict[str, dict] | None = None,
) -> T:
    """Builds cls from defaults, then the config file, then APEXRL_* env, then flags. With the
    algorithm registry, the algorithm's own settings too (its [<name>] table, env and flags):
    they become the config's `algo`; presets[<name>] then replace its defaults."""
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default=os.environ.get("APEXRL_CONFIG", ""))
    config_path = pre.parse_known_args(argv)[0].config
    data = _read_file(config_path) if config_path else {}
    settings = None
    algorithm = _algorithm_name(cls, argv, data) if algorithms else None
    if algorithms is not None and algorithm is not None:
        try:
            settings = algorithms.settings(algorithm)
        except ValueError as err:
            build_parser(cls, prog).error(str(err))
    parser = build_parser(cls, prog, settings)
    _refuse_other_algorithms_flags(parser, argv, algorithms, settings)
    args = parser.parse_args(argv)
    explicit = {a.dest for a in parser._actions if a.option_strings and _given(a, argv)}
    values = _values(cls, data, section, args.config, parser)
    algo: dict[str, Any] = {}
    if algorithms is not None and settings is not None:
        table, settings_class = settings
        others = {n: set(settings_fields(algorithms.settings(n)[1])) for n in algorithms.names}
        others[table] = set(settings_fields(settings_class))
        try:
            _check_tables(data, args.config, algorithms, table, others)
        except ValueError as err:
            parser.error(str(err))
        algo = (presets or {}).get(table, {}) | _values(
            settings_class, {table: data.get(table, {})}, table, args.config, parser
        )
    for target, kinds in ((values, _kinds(cls)), (algo, _kinds(settings and settings[1]))):
        for name, kind in kinds.items():
            if env_name(name) in os.environ:
                target[name] = convert(os.environ[env_name(name)], kind, env_name(name))
            if name in explicit:
                target[name] = convert(getattr(args, name), kind, name)
    if settings is not None:
        values["algo"] = settings[1](**algo)
    return cls(**values)


def settings_fields(settings_class: type) -> dict[str, type]:
    return {f.name: f.type for f in _fields(settings_class)}


def _kinds(cls: type | None) -> dict[str, Any]:
    """Each setting's converter: its type, Scheduled for one that takes a schedule, PerActor
    for one an actor may draw."""
    if cls is None:
        return {}
    return {f.name: _kind(f) for f in _fields(cls) if not f.metadata.get("file_only")}


def _kind(f: dataclasses.Field) -> Any:
    kind = Scheduled(f.metadata["schedule"]) if f.metadata.get("schedule") else f.type
    per_actor = f.metadata.get("per_actor")
    if not per_actor:
        return kind
    return PerActor(kind, per_actor == "ladder", f.metadata.get("within"))


def _values(cls: type, data: dict, section: str, path: str, parser) -> dict[str, Any]:
    """cls's settings from a config file: top-level keys cls has, then the section's (whose
    every key must be cls's)."""
    kinds = _kinds(cls)
    file_only = {f.name for f in _fields(cls) if f.metadata.get("file_only")}
    values: dict[str, Any] = {}
    from_file = {k: v for k, v in data.items() if not isinstance(v, dict)}
    from_file.update(data.get(section, {}))
    for key, value in from_file.items():
        if key in file_only:
            if not isinstance(value, list):
                parser.error(f"{path}: {key} must be an array of tables ([[{section}.{key}]])")
            values[key] = value
            continue
        if key not in kinds:
            # Top-level keys are shared by all services: only a section's own keys must match.
            if key in data.get(section, {}):
                parser.error(f"{path}: [{section}] has unknown key {key!r}")
            continue
        values[key] = convert(value, kinds[key], f"{path}: {key}")
    return values


def _refuse_other_algorithms_flags(parser, argv, algorithms, settings) -> None:
    """A flag of another algorithm's settings: say whose it is (argparse would only call it
    unrecognized)."""
    if settings is None:
        return
    own = {"--" + n.replace("_", "-") for n in settings_fields(settings[1])}
    own |= {o for a in parser._actions for o in a.option_strings}
    for name in algorithms.names:
        for field_name in settings_fields(algorithms.settings(name)[1]):
            flag = "--" + field_name.replace("_", "-")
            if flag not in own and any(t.split("=", 1)[0] == flag for t in argv):
                parser.error(
                    f"{flag} is a setting of algorithm {name}, not of {settings[0]}"
                    f" (the algorithm this runs)"
                )


def _given(action: argparse.Action, argv: list[str]) -> bool:
    """Whether the flag appears on the command line (argparse cannot tell a default from a value)."""
    names = set(action.option_strings)
    if isinstance(action, argparse.BooleanOptionalAction):
        names |= {s.replace("--", "--no-", 1) for s in action.option_strings}
    return any(t.split("=", 1)[0] in names for t in argv)
