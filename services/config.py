"""One documented config per service, read from defaults < config file < environment < flags.

Each service's settings are a dataclass whose field help is the documentation and the
`--help`. The same settings come from:
- a TOML file (`--config FILE` or APEXRL_CONFIG): top-level keys apply to every service,
  a `[replay]` / `[learner]` / ... table to that service only (one Kubernetes ConfigMap
  can drive every Deployment);
- environment variables APEXRL_<FIELD> (e.g. APEXRL_CAPACITY=100000);
- flags --<field-with-dashes>.
The commands beside the services (local, eval, set) have theirs in command_config.py.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

# Re-exported: every service reads its config with these.
from apexrl.config_parsing import (  # noqa: F401
    Algorithms,
    build_parser,
    convert,
    env_name,
    file_option,
    import_callable,
    option,
    parse,
)
from apexrl.table_config import (  # noqa: F401
    RATIO_ONLY,
    ReplayTableConfig,
    TableFields,
    replay_table_configs,
)


@dataclass
class ProcessConfig:
    """Settings every apexrl process shares."""

    host: str = option("0.0.0.0", "address the servers (gRPC, metrics) bind")
    metrics_port: int = option(9100, "Prometheus /metrics HTTP port (0 picks a free one)")
    ready_file: str = option("", "once serving, write the bound ports as JSON here")
    log_level: str = option("INFO", "logging level: DEBUG, INFO, WARNING, ERROR")
    metrics_tls_cert: str = option(
        "", "PEM certificate chain for /metrics: serve it over TLS only (empty: plain HTTP)"
    )
    metrics_tls_key: str = option("", "PEM private key of --metrics-tls-cert")
    metrics_client_ca: str = option(
        "", "PEM CA bundle: /metrics requires scrapers' client certificates it signed"
    )


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
    authorization: list = field(
        default_factory=list,
        metadata={
            "help": "config file only: a [[authorization]] array, one entry per role (role ="
            " 'actor', methods = ['apexrl.v1.Replay/Insert', ...]): what each caller may call"
            " under mutual TLS, its role read from its client certificate; absent: each role"
            " what its own code calls (apexrl.common.authz.DEFAULT_POLICY)",
            "file_only": True,
        },
    )

    def __post_init__(self) -> None:
        # Imported here: it brings grpc, which only the servers (this class) need.
        from apexrl.common import authz

        authz.parse_policy(self.authorization)  # an unknown role or method fails here


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
        "off-policy from replay: dqn or rainbow (discrete actions), dpg (continuous), r2d2"
        " (discrete, recurrent sequences), nec (discrete, episodic memory); on-policy unrolls"
        " from a queue table: impala, ppo or unreal (discrete); whole episodes: reinforce"
        " (discrete); gradients from the actors, applied as they come: a3c; or"
        " 'module:Builder', an algorithm defined elsewhere. Its own settings are the config"
        " file's [<algorithm>] table (`--algorithm NAME --help` lists them)",
    )
    env: str = option("CartPole-v1", "gymnasium environment id")
    hidden: str = option(
        "",
        "hidden layer sizes of the MLP torsos (vector observations), e.g. '128,128'; empty: the"
        " algorithm's default",
    )
    gamma: float = option(
        0.99,
        "discount factor (one per actor only in dqn, rainbow, dpg and nec)",
        per_actor="draw",
        within=(0.0, 1.0),
    )
    sticky_actions: float = option(
        0.25, "Atari: probability the emulator repeats the previous action (ALE v5's default)"
    )
    full_action_space: bool = option(
        False, "Atari: act in all 18 actions instead of the game's minimal set"
    )
    atari_backend: str = option(
        "auto",
        "Atari: the actors' emulator: 'envpool' (EnvPool's C++ envs, the same protocol),"
        " 'gymnasium' (ale-py under gymnasium's wrappers), 'auto' (envpool where it is installed"
        " and can play the game, else gymnasium, saying why in one log line); the evaluator and"
        " `apexrl eval` play with gymnasium",
    )
    seed: int = option(0, "random seed (0: from the OS); actors and envs derive theirs from it")
    # Reward shaping: what the actors learn from, never what is reported or scored
    # (docs/algorithms.md#reward-shaping has the order in which they apply).
    termination_reward: float = option(
        0.0, "added to the env's reward of a step that ends the episode (not a time limit's)"
    )
    reward_potential: str = option(
        "",
        "'package.module:function', a potential phi(observations [B, ...]) -> [B]: the actors"
        " learn from r + gamma * phi(s') - phi(s), phi(s') = 0 where the episode ends (empty:"
        " none)",
    )
    reward_scale: float = option(1.0, "the learnt reward is reward * this + reward_offset")
    reward_offset: float = option(0.0, "added to each learnt reward after reward_scale")
    reward_clip: float = option(0.0, "learnt rewards clipped to [-this, this], last (0: no clip)")
    priority_epsilon: float = option(
        1e-3, "priority = |TD error| + this (actors' initial ones and the learner's updates)"
    )
    # The algorithm's own settings (its Settings dataclass), filled by parse(); None: defaults.
    algo: Any = field(default=None, metadata={"internal": True})

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:  # a service's own checks (ServeConfig's)
            parent()
        check_rewards(self)


def check_rewards(config: AgentConfig) -> None:
    """ValueError naming the setting for reward shaping that cannot work: a scale that is not
    positive, a negative clip, a number that is not finite, a potential that cannot be
    imported or called."""
    if not config.reward_scale > 0:
        raise ValueError(f"reward_scale: must be > 0, got {config.reward_scale}")
    if config.reward_clip < 0:
        raise ValueError(f"reward_clip: must be > 0, or 0 for no clip, got {config.reward_clip}")
    for name in ("reward_scale", "reward_offset", "reward_clip", "termination_reward"):
        if not math.isfinite(getattr(config, name)):
            raise ValueError(f"{name}: must be a finite number, got {getattr(config, name)}")
    if config.reward_potential:
        import_callable(config.reward_potential, "reward_potential")


@dataclass
class ReplayConfig(ServeConfig, TableFields):
    """apexrl replay: experience replay server (prioritized tables, uniform ones, queues)."""

    tables: list = file_option(
        "config file only: a [[replay.tables]] array, one entry per table (keys: name and the"
        " table settings below); absent: one table, `table`, from the flat table settings"
    )
    table: str = option("default", "table name")
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
        super().__post_init__()
        if self.tables:  # the flat settings are a table of their own: not both
            for f in [*dataclasses.fields(TableFields), ReplayConfig.__dataclass_fields__["table"]]:
                if getattr(self, f.name) != f.default:
                    raise ValueError(
                        f"{f.name}: a flat table setting beside [[replay.tables]]; set it in"
                        " its table's entry"
                    )
        self.table_configs()  # a bad [[replay.tables]] array fails here, naming the table

    def table_configs(self) -> list[ReplayTableConfig]:
        """The server's tables: the [[replay.tables]] entries, else one from the flat settings."""
        if self.tables:
            return replay_table_configs(self.tables)
        names = [f.name for f in dataclasses.fields(TableFields)]
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
    learning_rate: float = option(2e-3, "Adam learning rate", schedule="updates")
    max_grad_norm: float = option(10.0, "gradient norm clipping")
    beta: float = option(
        0.4, "importance-sampling exponent of prioritized sampling (PER's beta)", schedule="updates"
    )
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
    live_file: str = option(
        "",
        "TOML file of NAME = VALUE lines: settings that may change during a run, applied at start"
        " and again whenever the file changes (a ConfigMap key, updated in place; empty: none)",
    )
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
    tensorboard: str = option(
        "",
        "also write the learner's gauges and counters as TensorBoard scalars (step: the update"
        " step) to this folder (empty: none; needs the tensorboard extra)",
    )
    # Behaviour cloning before the first version (learner/pretraining.py,
    # docs/demonstrations.md#behaviour-cloning).
    pretrain_demonstrations: str = option(
        "",
        "a folder of demonstrations of this env (apexrl eval --record DIR): before its first"
        " parameter version the learner trains the policy to take their actions (empty: off;"
        " not again when it resumes from a checkpoint)",
    )
    pretrain_steps: int = option(1000, "behaviour cloning's gradient steps")
    pretrain_batch_size: int = option(256, "(observation, action) pairs per cloning step")
    pretrain_learning_rate: float = option(1e-3, "behaviour cloning's Adam learning rate")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pretrain(self.pretrain_steps, self.pretrain_batch_size, self.pretrain_learning_rate)


def check_pretrain(steps: int, batch_size: int, learning_rate: float) -> None:
    """ValueError naming the pretrain_ setting that cannot work."""
    if steps < 0:
        raise ValueError(f"pretrain_steps: must be >= 0, got {steps}")
    if batch_size < 1:
        raise ValueError(f"pretrain_batch_size: must be >= 1, got {batch_size}")
    if not (learning_rate > 0 and math.isfinite(learning_rate)):
        raise ValueError(f"pretrain_learning_rate: must be finite and > 0, got {learning_rate}")


@dataclass
class RelayConfig(ClientTLSConfig, ServeConfig):
    """apexrl relay: pulls each parameter version from the learner once and serves it to the
    actors near it over the learner's own GetParameters (docs/scaling.md#parameter-relay)."""

    port: int = option(50053, "gRPC port (0 picks a free one; see --ready-file)")
    metrics_port: int = option(9104, "Prometheus /metrics HTTP port (0 picks a free one)")
    learner: str = option(
        "127.0.0.1:50052",
        "where the relay pulls from: the learner's address, or another relay's nearer to it"
        " (a tree of relays; a relay that reaches itself stops at start-up, naming this setting)",
    )
    min_pull_seconds: float = option(
        0.0,
        "least seconds between two versions pulled (0: each as the learner publishes it, for"
        " actors that long-poll every version); a learner that publishes faster than its"
        " actors pull costs a relay less with it set (docs/scaling.md#parameter-relay)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.min_pull_seconds <= 3600 or math.isnan(self.min_pull_seconds):
            raise ValueError(f"min_pull_seconds: must be 0 to 3600, got {self.min_pull_seconds}")


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
    learner: str = option(
        "127.0.0.1:50052",
        "learner server address: leases (the exploration ladder) always, and parameters unless"
        " `parameters` names relays (or while none of them answers)",
    )
    parameters: str = option(
        "",
        "parameter relays (apexrl relay) to pull parameters from, host:port,... tried in order,"
        " the learner when none answers (empty: pull from the learner;"
        " docs/scaling.md#parameter-relay)",
    )
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
    exploration: float = option(
        math.nan,
        "this actor's exploration parameter (the algorithm's: epsilon for dqn, r2d2 and nec,"
        " dpg's noise scale) in place of its place on the learner's ladder, e.g. an epsilon"
        " decay for a run of one actor; nan: the ladder's",
        schedule="env steps",
        per_actor="ladder",
    )
    threads: int = option(1, "torch CPU threads (where the policy acts with torch: not an MLP's)")


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
    cpu_share: float = option(
        0.0,
        "the most CPU this process takes, in cores: after a round of c CPU-seconds it waits"
        " until c / cpu_share seconds have passed since the round began (0: no bound, interval"
        " only); a candidate best still plays its confirmation round at once",
    )
    threads: int = option(1, "torch CPU threads (where the policy acts with torch: not an MLP's)")
    tensorboard: str = option(
        "",
        "also write the evaluator's gauges and counters as TensorBoard scalars (step: the"
        " parameter version played) to this folder (empty: none; needs the tensorboard extra)",
    )
    video_every: int = option(
        0,
        "record one episode of the 1st, (K+1)-th, (2K+1)-th, ... new best model as mp4 in"
        " video_dir (its first evaluation episode, same seed; 0: none; needs the video extra)",
    )
    video_dir: str = option("videos", "folder of the video_every recordings")
