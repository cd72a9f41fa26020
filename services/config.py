"""One documented config per service, read from defaults < config file < environment < flags.

Each service's settings are a dataclass whose field help is the documentation and the
`--help`. The same settings come from:
- a TOML file (`--config FILE` or APEXRL_CONFIG): top-level keys apply to every service,
  a `[replay]` / `[learner]` / ... table to that service only (one Kubernetes ConfigMap
  can drive every Deployment);
- environment variables APEXRL_<FIELD> (e.g. APEXRL_CAPACITY=100000);
- flags --<field-with-dashes>.
"""

import argparse
import dataclasses
import math
import os
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def option(default: Any, help: str) -> Any:
    """A config field with its documentation."""
    return field(default=default, metadata={"help": help})


@dataclass
class ProcessConfig:
    """Settings every apexrl process shares."""

    host: str = option("0.0.0.0", "address the servers (gRPC, metrics) bind")
    metrics_port: int = option(9100, "Prometheus /metrics HTTP port (0 picks a free one)")
    ready_file: str = option("", "once serving, write the bound ports as JSON here")
    log_level: str = option("INFO", "logging level: DEBUG, INFO, WARNING, ERROR")


@dataclass
class ServeConfig(ProcessConfig):
    """Settings every gRPC service shares."""

    port: int = option(50051, "gRPC port (0 picks a free one; see --ready-file)")
    max_message_mb: int = option(512, "largest gRPC message accepted or sent, in MiB")
    grace_seconds: float = option(10.0, "on SIGTERM, how long in-flight calls may take to finish")
    tls_cert: str = option(
        "", "PEM certificate chain of this server: serve TLS only (empty: plaintext)"
    )
    tls_key: str = option("", "PEM private key of --tls-cert")
    tls_client_ca: str = option(
        "", "PEM CA bundle: require client certificates it signed (mutual TLS)"
    )


@dataclass
class ClientTLSConfig:
    """How a process's gRPC clients reach TLS servers."""

    tls_ca: str = option(
        "",
        "PEM CA bundle that signed the servers' certificates: connect with TLS (empty: plaintext)",
    )
    tls_client_cert: str = option(
        "", "PEM certificate chain this process presents to servers (mutual TLS)"
    )
    tls_client_key: str = option("", "PEM private key of --tls-client-cert")


@dataclass
class AgentConfig:
    """What the learner, actors and evaluator must agree on (put it at the top of a shared file)."""

    algorithm: str = option(
        "dqn",
        "dqn (discrete actions) or dpg (continuous), off-policy from prioritized replay; impala"
        " or ppo (discrete, on-policy unrolls from a queue table); or 'module:Builder', an"
        " algorithm defined elsewhere. Its own settings are the config file's [<algorithm>]"
        " table (`--algorithm NAME --help` lists them)",
    )
    env: str = option("CartPole-v1", "gymnasium environment id")
    hidden: str = option(
        "",
        "hidden layer sizes of the MLP torsos (vector observations), e.g. '128,128'; empty: the"
        " algorithm's default",
    )
    gamma: float = option(0.99, "discount factor")
    sticky_actions: float = option(
        0.25, "Atari: probability the emulator repeats the previous action (ALE v5's default)"
    )
    full_action_space: bool = option(
        False, "Atari: act in all 18 actions instead of the game's minimal set"
    )
    seed: int = option(0, "random seed (0: from the OS); actors and envs derive theirs from it")
    priority_epsilon: float = option(
        1e-3, "priority = |TD error| + this (actors' initial ones and the learner's updates)"
    )
    # The algorithm's own settings (its Settings dataclass), filled by parse(); None: defaults.
    algo: Any = field(default=None, metadata={"internal": True})


def file_option(help: str) -> Any:
    """A config field only a config file can set (a TOML array of tables): no flag, no env."""
    return field(default_factory=list, metadata={"help": help, "file_only": True})


@dataclass
class ReplayTableConfig:
    """One `[[replay.tables]]` entry: a table in Reverb's vocabulary (replay/samplers.py and the
    file comment of protos/apexrl/v1/replay.proto have the semantics)."""

    name: str = option("", "table name (required, unique in the server)")
    capacity: int = option(1_000_000, "items the table holds")
    sampler: str = option("prioritized", "prioritized, uniform, fifo (oldest first) or lifo")
    remover: str = option(
        "fifo", "at capacity: fifo (evict the oldest) or none (inserts wait: a queue)"
    )
    max_times_sampled: int = option(0, "an item leaves after this many samples (0: never)")
    alpha: float = option(0.6, "prioritized: P(i) = p_i^alpha / sum p^alpha")
    rate_limiter: str = option(
        "ratio", "ratio (the three settings below) or queue (remover none: wait for room/items)"
    )
    min_size_to_sample: int = option(1000, "ratio: sampling waits until the table holds this many")
    samples_per_insert: float = option(0.0, "ratio: target sampled items per inserted item")
    error_buffer: float = option(0.0, "ratio: allowed deviation from samples_per_insert")
    signature: str = option("", "column specs as for the replay's --signature")


_RATIO_ONLY = ("min_size_to_sample", "samples_per_insert", "error_buffer")


def replay_table_configs(entries: list[dict], where: str = "[[replay.tables]]"):
    """The `[[replay.tables]]` entries as ReplayTableConfig; ValueError naming the table and the
    key for an unknown key, a missing name, a name declared twice, or a ratio setting on a queue."""
    kinds = {f.name: f.type for f in dataclasses.fields(ReplayTableConfig)}
    tables: list[ReplayTableConfig] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: entry {i} must be a table of settings, got {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: entry {i} needs a name (a non-empty string)")
        for key in entry:
            if key not in kinds:
                raise ValueError(f"{where}: table {name!r} has unknown key {key!r}")
        if name in {t.name for t in tables}:
            raise ValueError(f"{where}: table {name!r} is declared twice")
        if entry.get("rate_limiter") == "queue":
            for key in _RATIO_ONLY:
                if key in entry:
                    raise ValueError(
                        f"{where}: table {name!r}: {key} applies to rate_limiter 'ratio' only"
                    )
        values = {
            k: _convert(v, kinds[k], f"{where}: table {name!r}: {k}") for k, v in entry.items()
        }
        tables.append(ReplayTableConfig(**values))
    return tables


@dataclass
class ReplayConfig(ServeConfig):
    """apexrl replay: experience replay server (prioritized tables, uniform ones, queues)."""

    tables: list = file_option(
        "config file only: a [[replay.tables]] array, one entry per table (keys: those of"
        " ReplayTableConfig); absent: one table from the flat settings table, capacity, alpha,"
        " signature, min_size_to_sample, samples_per_insert, error_buffer"
    )
    table: str = option("default", "table name")
    capacity: int = option(1_000_000, "items the table holds; FIFO eviction beyond")
    sampler: str = option("prioritized", "prioritized, uniform, fifo (oldest first) or lifo")
    remover: str = option(
        "fifo", "at capacity: fifo (evict the oldest) or none (inserts wait: a queue)"
    )
    max_times_sampled: int = option(0, "an item leaves after this many samples (0: never)")
    rate_limiter: str = option(
        "ratio",
        "ratio (min_size_to_sample, samples_per_insert, error_buffer) or queue (remover none:"
        " inserts wait for room, samples for a whole batch)",
    )
    alpha: float = option(0.6, "priority exponent: P(i) = p_i^alpha / sum p^alpha; 0 is uniform")
    signature: str = option(
        "",
        "column specs 'name:dtype:d0xd1,...' e.g. 'obs:float32:4,action:int64:' "
        "(empty: fixed by the first insert)",
    )
    min_size_to_sample: int = option(1000, "sampling waits until the table holds this many items")
    samples_per_insert: float = option(
        0.0, "rate limiter: target sampled items per inserted item (0 disables the ratio)"
    )
    error_buffer: float = option(
        0.0, "rate limiter: allowed deviation from samples_per_insert, in samples"
    )
    max_batch_size: int = option(65_536, "largest insert or sample batch, in items")
    checkpoint_dir: str = option("", "directory for checkpoints (empty: no checkpoints)")
    checkpoint_interval: float = option(
        600.0, "seconds between periodic checkpoints (0: only on request/SIGTERM)"
    )
    seed: int = option(0, "sampling RNG seed (0: from the OS)")
    shard: str = option(
        "0",
        "this replay's shard id, 0-32767 (the top bits of its keys), or 'hostname': the ordinal "
        "at the end of the host name (StatefulSet pod replay-2 is shard 2)",
    )

    def __post_init__(self) -> None:
        self.table_configs()  # a bad [[replay.tables]] array fails here, naming the table

    def table_configs(self) -> list[ReplayTableConfig]:
        """The server's tables: the [[replay.tables]] entries, else one from the flat settings."""
        if self.tables:
            return replay_table_configs(self.tables)
        # Every table setting but the name has a flat setting of the same name.
        names = [f.name for f in dataclasses.fields(ReplayTableConfig) if f.name != "name"]
        return [ReplayTableConfig(name=self.table, **{n: getattr(self, n) for n in names})]


@dataclass
class LearnerConfig(AgentConfig, ClientTLSConfig, ServeConfig):
    """apexrl learner: trains the algorithm's networks from replay and serves their parameters to
    actors and the evaluator."""

    port: int = option(50052, "gRPC port (0 picks a free one; see --ready-file)")
    metrics_port: int = option(9101, "Prometheus /metrics HTTP port (0 picks a free one)")
    replay: str = option(
        "127.0.0.1:50051",
        "replay address: host:port (one replay), h0:p,h1:p,... (shards 0, 1, ... in order) or "
        "dns:///name:port (every address the name resolves to is a shard)",
    )
    device: str = option(
        "auto", "torch device: auto (CUDA when present, else CPU), cpu, cuda, cuda:N"
    )
    batch_size: int = option(256, "items (transitions, unrolls) per update")
    learning_rate: float = option(2e-3, "Adam learning rate")
    max_grad_norm: float = option(10.0, "gradient norm clipping")
    beta: float = option(0.4, "importance-sampling exponent sent with each sample request")
    publish_interval: int = option(
        10,
        "updates between parameter versions for actors (an algorithm whose batches must come"
        " from the newest version, as ppo's, publishes after every update)",
    )
    prefetch: int = option(4, "sampled batches buffered ahead of the training step")
    lease_seconds: float = option(
        10.0, "actor lease length: an actor silent this long leaves the ladder"
    )
    checkpoint_dir: str = option("", "directory for checkpoints (empty: no checkpoints)")
    checkpoint_interval: float = option(
        300.0, "seconds between periodic checkpoints (0: only on SIGTERM)"
    )
    max_updates: int = option(0, "stop training after this many updates (0: never)")
    history_mb: float = option(
        0.0,
        "MB of recent parameter versions kept besides the newest, for evaluators that play"
        " every version (evaluator window); 0 keeps the newest only",
    )
    threads: int = option(1, "torch CPU threads (one process per core keeps 2-core machines fair)")
    precision: str = option(
        "float32",
        "float32; bfloat16: each update's forward and backward passes under torch.autocast in"
        " bfloat16 (weights, gradients and Adam's state stay float32); auto: bfloat16 where the"
        " device computes it natively (CUDA with bf16, CPUs with AVX-512 BF16 or AMX), float32"
        " elsewhere",
    )


@dataclass
class ActorConfig(AgentConfig, ClientTLSConfig, ProcessConfig):
    """apexrl actor: acts in envs with the algorithm's behaviour policy on its copy of the
    parameters; the algorithm's items (n-step transitions, unrolls) to replay."""

    metrics_port: int = option(9102, "Prometheus /metrics HTTP port (0 picks a free one)")
    replay: str = option(
        "127.0.0.1:50051",
        "replay address: host:port (one replay), h0:p,h1:p,... (shards 0, 1, ... in order) or "
        "dns:///name:port (every address the name resolves to is a shard)",
    )
    learner: str = option("127.0.0.1:50052", "learner server address")
    num_envs: int = option(8, "environments stepped together (batched inference)")
    pull_interval: int = option(400, "env steps between parameter pulls (Ape-X: 400)")
    insert_batch: int = option(
        64, "items per insert (adders whose items the learner waits for insert each at once)"
    )
    life_loss_terminal: bool = option(
        False, "Atari: a lost life ends the n-step returns (training only; the game goes on)"
    )
    buffer_limit: int = option(
        100_000, "transitions held while replay is unreachable; beyond, the oldest are dropped"
    )
    threads: int = option(1, "torch CPU threads")


@dataclass
class EvaluatorConfig(AgentConfig, ClientTLSConfig, ProcessConfig):
    """apexrl evaluator: plays the newest parameters greedily and reports the returns."""

    metrics_port: int = option(9103, "Prometheus /metrics HTTP port (0 picks a free one)")
    learner: str = option("127.0.0.1:50052", "learner server address")
    episodes: int = option(10, "episodes per evaluation (played in parallel)")
    confirm_episodes: int = option(
        50,
        "episodes played again, on fresh seeds, by a version whose evaluation beats the best so"
        " far; its score is the mean over both rounds (0: no second round)",
    )
    epsilon: float = option(0.0, "exploration during evaluation (0: greedy)")
    interval: float = option(1.0, "least seconds between evaluations (only new versions count)")
    window: int = option(
        0,
        "play every version in order, at most this many behind the learner's newest (older"
        " ones are skipped, counted; the learner keeps recent versions for it: its history_mb);"
        " 0: the newest only",
    )
    nice: int = option(
        0,
        "lower this process's CPU priority by this much (0-19, os.nice): on cores shared with"
        " training, evaluation then takes only the CPU that training leaves idle",
    )
    threads: int = option(1, "torch CPU threads")


def _convert(value: Any, kind: type, name: str) -> Any:
    if kind is bool and isinstance(value, str):
        lowered = value.strip().lower()
        if lowered not in {"1", "0", "true", "false", "yes", "no"}:
            raise ValueError(f"{name}: expected a boolean, got {value!r}")
        return lowered in {"1", "true", "yes"}
    try:
        return kind(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}") from err


def env_name(name: str) -> str:
    return "APEXRL_" + name.upper()


SECTIONS = ("replay", "learner", "actor", "evaluator", "local", "eval")


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
    if algorithm is not None:
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
    if settings is not None:
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
                target[name] = _convert(os.environ[env_name(name)], kind, env_name(name))
            if name in explicit:
                target[name] = getattr(args, name)
    if settings is not None:
        values["algo"] = settings[1](**algo)
    return cls(**values)


def settings_fields(settings_class: type) -> dict[str, type]:
    return {f.name: f.type for f in _fields(settings_class)}


def _kinds(cls: type | None) -> dict[str, type]:
    if cls is None:
        return {}
    return {f.name: f.type for f in _fields(cls) if not f.metadata.get("file_only")}


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
        values[key] = _convert(value, kinds[key], f"{path}: {key}")
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


@dataclass
class LocalConfig(AgentConfig):
    """apexrl local: replay, learner, actors and an evaluator as processes on loopback."""

    actors: int = option(2, "actor processes")
    replay_shards: int = option(
        1,
        "replay processes (shards); the [replay] capacity, min_size_to_sample and error_buffer "
        "are split evenly over them, so the totals stay as set",
    )
    run_dir: str = option(
        "",
        "run folder for config, logs, metrics CSV, plot, checkpoints (default runs/<env>-<time>)",
    )
    max_seconds: float = option(300.0, "give up after this many seconds")
    max_env_steps: int = option(0, "give up after this many env steps (0: no limit)")
    target_return: float = option(
        math.nan,
        "the best model's score (mean evaluation return) that counts as solved; nan (the"
        " default): the env's threshold (gymnasium's reward_threshold, or local.TARGETS)",
    )
    progress_interval: float = option(0.5, "seconds between progress updates and metrics CSV rows")
    log_level: str = option("INFO", "logging level of the services (their logs go to RUN_DIR/logs)")


@dataclass
class EvalConfig:
    """apexrl eval: plays a learner checkpoint greedily and prints the returns."""

    checkpoint: str = option(
        "",
        "checkpoint file, or a learner's checkpoint directory: its best model (the parameters"
        " the evaluator scored highest), else its newest checkpoint",
    )
    latest: bool = option(False, "in a directory, play the newest checkpoint, not the best model")
    episodes: int = option(10, "episodes to play")
    seed: int = option(
        1_000_000,
        "seed of the first episode (episode k: seed + k); the evaluator counts up from the run's"
        " seed, so the default plays episodes it never saw",
    )
    epsilon: float = option(0.0, "exploration (0: greedy)")
