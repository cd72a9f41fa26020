"""The apexrl Grafana dashboard, generated with grafana-foundation-sdk.

`python deploy/grafana/dashboard.py` rewrites apexrl.json (import it in Grafana) and
dashboard-configmap.yaml (the same JSON in a ConfigMap the kube-prometheus-stack Grafana
sidecar loads); `--check` exits 1 when either checked-in file differs from the generated one.

Every query is plain PromQL, runnable as it stands (`promtool query instant`): fixed [1m]
rate windows, no Grafana macros; only the datasource is a dashboard variable. Metric names
are the catalogue in docs/metrics.md; `panel_queries()` lists every expression.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import TypeVar

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models import prometheus as prometheus_models

HERE = Path(__file__).resolve().parent
DASHBOARD_JSON = HERE / "apexrl.json"
CONFIGMAP_YAML = HERE / "dashboard-configmap.yaml"

UID = "apexrl"
TITLE = "apexrl"
NAMESPACE = "apexrl"
CONFIGMAP_NAME = "apexrl-grafana-dashboard"
# The label the kube-prometheus-stack Grafana sidecar looks for (grafana.sidecar.dashboards.label).
SIDECAR_LABEL = {"grafana_dashboard": "1"}
# Restarts come from every process's own start time (prometheus_client's process collector),
# so the panel needs nothing beyond apexrl's pods (no kube-state-metrics).
RESTARTS_METRIC = "process_start_time_seconds"

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = dashboard_models.DataSourceRef(
    type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}"
)
Panel = TypeVar("Panel", timeseries.Panel, heatmap.Panel)
FULL, HALF, THIRD = 24, 12, 8
HEIGHT = 8


# deploy/k8s/autoscaling/keda-scaledobject.yaml's query without its namespace matchers (the
# dashboard shows one deployment's Prometheus): tests/deploy/test_autoscaling.py keeps them equal.
ACTOR_DEMAND = (
    "1 + clamp_max((sum(rate(apexrl_learner_prefetch_wait_seconds_total[2m])) or vector(0)), 1)"
    ' - clamp_max(((sum(rate(apexrl_replay_rate_limiter_wait_seconds_sum{operation="insert"}'
    "[2m])) / count(apexrl_actor_env_steps_total)) or vector(0)), 1)"
)


def query(expr: str, legend: str = "__auto") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def with_targets(panel: Panel, targets: list[prometheus.Dataquery]) -> Panel:
    for i, target in enumerate(targets):
        panel.with_target(target.ref_id(chr(ord("A") + i)))
    return panel


def graph(
    title: str,
    description: str,
    targets: list[prometheus.Dataquery],
    unit: str = "short",
    span: int = HALF,
    log_scale: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(HEIGHT)
        .line_width(1)
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
    )
    if log_scale:
        panel.scale_distribution(
            common_builders.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)
        )
    return with_targets(panel, targets)


def bucket_heatmap(
    title: str, description: str, expr: str, unit: str, span: int = HALF
) -> heatmap.Panel:
    """A heatmap of a histogram's cumulative `le` buckets, drawn as Prometheus reports them."""
    target = query(expr, "{{le}}").format(prometheus_models.PromQueryFormat.HEATMAP)
    panel = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(span)
        .height(HEIGHT)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
        )
    )
    return with_targets(panel, [target])


def quantiles(bucket: str) -> list[prometheus.Dataquery]:
    """p50 / p90 / p99 of a histogram over all pods."""
    return [
        query(f"histogram_quantile({q}, sum by (le) (rate({bucket}[1m])))", f"p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]


def build() -> dashboard_models.Dashboard:
    builder = (
        dashboard_builders.Dashboard(TITLE)
        .uid(UID)
        .description(
            "Ape-X DQN on apexrl: actors, replay, learner, evaluator and their gRPC traffic."
        )
        .tags(["apexrl", "reinforcement-learning"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard_builders.DatasourceVariable(DATASOURCE_VARIABLE)
            .label("Prometheus")
            .type("prometheus")
        )
    )

    builder.with_row(dashboard_builders.Row("Acting"))
    builder.with_panel(
        graph(
            "Env steps/s",
            "All actors together, and each actor pod (apexrl_actor_env_steps_total).",
            [
                query("sum(rate(apexrl_actor_env_steps_total[1m]))", "total"),
                query("sum by (pod) (rate(apexrl_actor_env_steps_total[1m]))", "{{pod}}"),
            ],
        )
    )
    builder.with_panel(
        graph(
            "Episode return",
            "Return of finished training episodes (exploring, so below the greedy "
            "evaluation): median over all actors and the mean of each actor pod.",
            [
                query(
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(apexrl_actor_episode_return_bucket[1m])))",
                    "median, all actors",
                ),
                query(
                    "sum by (pod) (rate(apexrl_actor_episode_return_sum[1m])) / "
                    "sum by (pod) (rate(apexrl_actor_episode_return_count[1m]))",
                    "mean {{pod}}",
                ),
            ],
        )
    )
    builder.with_panel(
        graph(
            "Evaluation return",
            "Mean return of the evaluator's greedy episodes on the newest parameters, and the"
            " score of the best model the learner keeps (mean over both evaluation rounds).",
            [
                query("max(apexrl_evaluation_mean_return)", "greedy mean return"),
                query("max(apexrl_evaluation_best_mean_return)", "best model"),
            ],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Exploration ladder",
            "Each actor's leased exploration parameter over the live actors: epsilon"
            " 0.4^(1 + 7 i/(N-1)) when dqn runs, the Gaussian noise scale"
            " 0.5 (0.05/0.5)^(i/(N-1)) (a fraction of the action half-range) when dpg runs.",
            [query("max by (pod) (apexrl_actor_epsilon or apexrl_actor_noise_scale)", "{{pod}}")],
            span=THIRD,
            log_scale=True,
        )
    )
    builder.with_panel(
        graph(
            "Parameter version lag",
            "How many versions the learner was ahead at each actor's last parameter pull, and of"
            " the version the evaluator played last (with a window it plays every version, and"
            " skips those further behind: skipped per second).",
            [
                query("max by (pod) (apexrl_actor_parameter_lag)", "{{pod}}"),
                query("max(apexrl_evaluation_versions_behind)", "evaluator behind"),
                query(
                    "sum(rate(apexrl_evaluation_versions_skipped_total[1m]))",
                    "evaluator skipped / s",
                ),
            ],
            span=THIRD,
        )
    )

    builder.with_row(dashboard_builders.Row("Replay"))
    # Replay runs as shards (StatefulSet pods replay-0, replay-1, ...: pod replay-N is shard N,
    # apexrl_replay_shard): each panel shows all shards summed, or one series per shard pod.
    builder.with_panel(
        graph(
            "Replay size / capacity, all shards",
            "Items stored and the capacity, summed over the shards (capacity is per shard).",
            [
                query("sum by (table) (apexrl_replay_size)", "size {{table}}"),
                query("sum by (table) (apexrl_replay_capacity)", "capacity {{table}}"),
            ],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Replay size per shard",
            "Items each shard stores (pod replay-N is shard N). A new shard starts empty, or"
            " with the items of its checkpoint volume if it ran before.",
            [query("sum by (pod) (apexrl_replay_size)", "{{pod}}")],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Replay memory",
            "Bytes the stored items take (columns, compressed frames, keys, priorities, sum"
            " tree): all shards, and each shard.",
            [
                query("sum(apexrl_replay_stored_bytes)", "all shards"),
                query("sum by (pod) (apexrl_replay_stored_bytes)", "{{pod}}"),
            ],
            unit="bytes",
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Insert and sample rates, all shards",
            "Items inserted and sampled per second over every shard (a batch of B counts B).",
            [
                query(
                    "sum by (table) (rate(apexrl_replay_inserts_total[1m]))",
                    "inserts {{table}}",
                ),
                query(
                    "sum by (table) (rate(apexrl_replay_samples_total[1m]))",
                    "samples {{table}}",
                ),
            ],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Insert and sample rates per shard",
            "Items each shard takes in (inserts go round robin over the live shards) and"
            " serves per second.",
            [
                query("sum by (pod) (rate(apexrl_replay_inserts_total[1m]))", "inserts {{pod}}"),
                query("sum by (pod) (rate(apexrl_replay_samples_total[1m]))", "samples {{pod}}"),
            ],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Sampling share per shard",
            "Each shard's part of the total priority mass (sum of p^alpha), which is the share"
            " of every batch it should serve, and the share of the samples it did serve.",
            [
                query(
                    "sum by (pod) (apexrl_replay_total_priority) / "
                    "scalar(sum(apexrl_replay_total_priority))",
                    "priority mass {{pod}}",
                ),
                query(
                    "sum by (pod) (rate(apexrl_replay_samples_total[1m])) / "
                    "scalar(sum(rate(apexrl_replay_samples_total[1m])))",
                    "samples {{pod}}",
                ),
            ],
            unit="percentunit",
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Samples per insert",
            "Sample rate over insert rate, all shards: how often each transition is replayed.",
            [
                query(
                    "sum by (table) (rate(apexrl_replay_samples_total[1m])) / "
                    "sum by (table) (rate(apexrl_replay_inserts_total[1m]))",
                    "{{table}}",
                )
            ],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Bytes per stored item",
            "Replay memory per item, all shards: columns, compressed frames, keys, priorities,"
            " sum tree.",
            [
                query(
                    "sum by (table) (apexrl_replay_stored_bytes) / "
                    "sum by (table) (apexrl_replay_size)",
                    "{{table}}",
                )
            ],
            unit="bytes",
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Live shards",
            "Replay shards Prometheus scrapes (kubectl scale statefulset/replay).",
            [query("count(apexrl_replay_shard)", "shards")],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Frame compression ratio",
            "Observation bytes before over after the actors' zstd compression (Atari; empty"
            " for envs whose observations are not compressed).",
            [
                query(
                    "sum(rate(apexrl_actor_frame_raw_bytes_total[1m])) / "
                    "sum(rate(apexrl_actor_frame_compressed_bytes_total[1m]))",
                    "ratio",
                )
            ],
        )
    )
    builder.with_panel(
        graph(
            "Frame decode time per batch",
            "Seconds the learner's input pipeline spends decompressing one sampled batch (off"
            " the training thread), and sampled items dropped because their frames did not"
            " decode.",
            [
                query(
                    "sum(rate(apexrl_learner_decode_seconds_total[1m])) / "
                    "sum(rate(apexrl_learner_updates_total[1m]))",
                    "seconds per batch",
                ),
                query("sum(rate(apexrl_learner_decode_failures_total[1m]))", "dropped items/s"),
            ],
            unit="s",
        )
    )
    builder.with_panel(
        bucket_heatmap(
            "Priority distribution",
            "Priorities of the stored items, all shards (apexrl_replay_priority, a gauge"
            " histogram).",
            "sum by (le) (apexrl_replay_priority_bucket)",
            unit="short",
        )
    )
    builder.with_panel(
        graph(
            "Sample age",
            "Inserts since a sampled item was written (into its shard): how old the replayed"
            " experience is.",
            quantiles("apexrl_replay_sample_age_bucket"),
        )
    )

    builder.with_row(dashboard_builders.Row("Learning"))
    builder.with_panel(
        graph(
            "Learner updates/s",
            "SGD steps per second.",
            [query("sum(rate(apexrl_learner_updates_total[1m]))", "updates/s")],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Loss",
            "Importance-weighted Huber loss of the last batch.",
            [query("max(apexrl_learner_loss)", "loss")],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "TD error",
            "Mean |TD error| of the last batch.",
            [query("max(apexrl_learner_td_error_mean)", "mean |TD error|")],
            span=THIRD,
        )
    )
    builder.with_panel(
        graph(
            "Prefetch wait",
            "Fraction of SGD steps that still waited for a sampled batch: above 0, the "
            "learner is starved by replay.",
            [query("max(apexrl_learner_prefetch_wait_fraction)", "wait fraction")],
            unit="percentunit",
        )
    )
    builder.with_panel(
        graph(
            "Actor demand (autoscaling)",
            "The ratio deploy/k8s/autoscaling scales the actors on, over its 2m windows: 1 + "
            "the learner's wait for batches - the share of each actor's time the rate limiter "
            "held its inserts. Above 1.1 the autoscaler adds actors, below 0.9 it removes some.",
            [query(ACTOR_DEMAND, "actor demand ratio")],
        )
    )
    builder.with_panel(
        graph(
            "Policy lag and queue depth (impala, ppo)",
            "On-policy learning: the learner's version minus the mean version that acted its last "
            "batch (impala tolerates it through V-trace; ppo trains only on lag 0 and drops older "
            "unrolls, counted per second), and the items each table holds (a queue's depth).",
            [
                query("max(apexrl_learner_policy_lag)", "policy lag (versions)"),
                query(
                    "sum(rate(apexrl_learner_stale_items_dropped_total[1m]))",
                    "stale items dropped/s",
                ),
                query("sum by (table) (apexrl_replay_size)", "{{table}} items"),
            ],
        )  # fmt: skip
    )
    builder.with_panel(
        graph(
            "Parameter bytes sent/s",
            "GetParameters answers, in bytes per second: the learner's (to actors, parameter "
            "relays and the evaluator) and the relays' (to their actors). With relays, the "
            "learner's is their pulls and the actors' lease renewals.",
            [
                query("sum(rate(apexrl_learner_parameter_bytes_sent_total[1m]))", "learner"),
                query("sum(rate(apexrl_relay_parameter_bytes_served_total[1m]))", "relays"),
            ],
            unit="Bps",
        )
    )
    builder.with_panel(
        graph(
            "Parameter relays",
            "Per relay: versions pulled from the learner per second, its callers (actors) seen "
            "in the last minute, and the newest version it serves behind the learner's.",
            [
                query(
                    "sum by (pod) (rate(apexrl_relay_versions_pulled_total[1m]))",
                    "{{pod}} versions/s",
                ),
                query("sum by (pod) (apexrl_relay_clients)", "{{pod}} clients"),
                query(
                    "scalar(max(apexrl_learner_parameter_version)) - "
                    "max by (pod) (apexrl_relay_parameter_version)",
                    "{{pod}} versions behind",
                ),
            ],
        )  # fmt: skip
    )
    builder.with_panel(
        graph(
            "Process restarts in the last hour",
            "How often each pod's service process started anew (process_start_time_seconds "
            "changed): crashes, OOM kills, liveness failures.",
            [query(f"sum by (pod) (changes({RESTARTS_METRIC}[1h]))", "{{pod}}")],
        )
    )

    builder.with_row(dashboard_builders.Row("gRPC"))
    builder.with_panel(
        graph(
            "gRPC latency p50",
            "Median handling time by service and method (for SampleStream: the stream's life).",
            [
                query(
                    "histogram_quantile(0.5, sum by (le, grpc_service, grpc_method) "
                    "(rate(grpc_server_handling_seconds_bucket[1m])))",
                    "{{grpc_service}}/{{grpc_method}}",
                )
            ],
            unit="s",
        )
    )
    builder.with_panel(
        graph(
            "gRPC latency p99",
            "99th percentile handling time by service and method.",
            [
                query(
                    "histogram_quantile(0.99, sum by (le, grpc_service, grpc_method) "
                    "(rate(grpc_server_handling_seconds_bucket[1m])))",
                    "{{grpc_service}}/{{grpc_method}}",
                )
            ],
            unit="s",
        )
    )
    builder.with_panel(
        graph(
            "gRPC errors/s",
            "RPCs finished with a status other than OK, by service and method; methods "
            "without errors show 0 rather than nothing.",
            [
                query(
                    'sum by (grpc_service, grpc_method) (rate(grpc_server_handled_total{grpc_code!="OK"}[1m]))'
                    " or "
                    "0 * sum by (grpc_service, grpc_method) (rate(grpc_server_handled_total[1m]))",
                    "{{grpc_service}}/{{grpc_method}}",
                )
            ],
            unit="reqps",
            span=FULL,
        )
    )

    model = builder.build()
    for panel_id, panel in enumerate(model.panels or [], start=1):
        panel.id_val = panel_id
    return model


def dashboard_json() -> dict:
    return json.loads(json.dumps(build(), cls=JSONEncoder))


def panel_queries() -> list[str]:
    """Every PromQL expression in the dashboard, in panel order."""
    return [
        target["expr"]
        for panel in dashboard_json()["panels"]
        for target in panel.get("targets", [])
    ]


def render() -> dict[Path, str]:
    """The generated files and their text."""
    text = json.dumps(dashboard_json(), indent=2) + "\n"
    indented = "".join(f"    {line}\n" for line in text.splitlines())
    labels = "".join(f'    {key}: "{value}"\n' for key, value in SIDECAR_LABEL.items())
    configmap = (
        "# Generated by deploy/grafana/dashboard.py: do not edit, rerun it.\n"
        "# The apexrl dashboard for the kube-prometheus-stack Grafana sidecar, which loads\n"
        '# ConfigMaps labelled grafana_dashboard: "1" (from every namespace when\n'
        "# grafana.sidecar.dashboards.searchNamespace is ALL). Apply after deploy/k8s/.\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {CONFIGMAP_NAME}\n"
        f"  namespace: {NAMESPACE}\n"
        "  labels:\n"
        f"{labels}"
        "    app.kubernetes.io/part-of: apexrl\n"
        "data:\n"
        f"  {DASHBOARD_JSON.name}: |\n"
        f"{indented}"
    )
    return {DASHBOARD_JSON: text, CONFIGMAP_YAML: configmap}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a checked-in file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
    if stale:
        names = ", ".join(str(path) for path in stale)
        print(f"stale: {names}; run python {Path(__file__).name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
