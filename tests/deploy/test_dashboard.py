"""The Grafana dashboard (deploy/grafana): generated, valid, and only querying catalogued metrics.

Whether every query returns data is for an end-to-end run against a real Prometheus
(`dashboard.panel_queries()`); here: the checked-in files equal freshly generated ones, the
JSON is a dashboard Grafana can load, every metric a query names is in docs/metrics.md's metrics
table, and the ConfigMap is what the kube-prometheus-stack sidecar picks up.
"""

import importlib.util
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
README = REPO / "docs" / "metrics.md"
NAMESPACE = "apexrl"
K8S_VERSIONS = ["1.27.0", "1.32.0"]
# The one metric not exported by apexrl: the restarts panel needs kube-state-metrics.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
UNIT_SUFFIXES = {"seconds", "bytes", "total", "ratio"}
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "group_left",
    "group_right",
    "inf",
    "nan",
}


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "apexrl_grafana_dashboard", GRAFANA / "dashboard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dashboard = load_generator()


def catalogue() -> dict[str, str]:
    """docs/metrics.md's metrics table as {name: type}.

    A row may list several names with `_suffix` shorthands (`apexrl_learner_loss`,
    `_td_error_mean`) and several types ("counter, gauge"), paired in order when they match up.
    A name missing from the table fails the tests below, so the parse cannot hide one.
    """
    text = README.read_text()
    section = text[text.index("## Metrics") :]
    section = section[: section.index("\n## ", 1)]
    metrics: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([a-z_:]+)`", cells[0])
        types = [t.strip() for t in cells[1].split(",")]
        full_names = [names[0]]
        for shorthand in names[1:]:
            if shorthand.startswith("_"):
                full_names.append(expand(names[0], shorthand))
            else:
                full_names.append(shorthand)
        for i, name in enumerate(full_names):
            # Unpaired ("counter, gauge" for three names): any of them, left unchecked.
            metrics[name] = types[i] if len(types) == len(full_names) else cells[1]
    return metrics


def expand(first: str, shorthand: str) -> str:
    """`_size_bytes` after `apexrl_replay_checkpoint_duration_seconds` names
    `apexrl_replay_checkpoint_size_bytes`: the shorthand replaces the first name's last word,
    with its unit suffix if it has one (Prometheus naming: `<stem>_<what>[_<unit>]`)."""
    words = first.split("_")
    stem = words[:-2] if words[-1] in UNIT_SUFFIXES else words[:-1]
    return "_".join(stem) + shorthand


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (in matchers and grouping clauses) or durations."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for name, call in re.findall(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", expr):
        if not call and name.lower() not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def test_metric_names_finds_only_metrics():
    expr = (
        'histogram_quantile(0.99, sum by (le, grpc_method) (rate(a_bucket{grpc_code!="OK"}[1m])))'
        " / on (pod) group_left max without (table) (b offset 5m) or 1e3 * c_total"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c_total"}


# --- generated ------------------------------------------------------------------------------


def test_checked_in_files_equal_generated_ones():
    for path, text in dashboard.render().items():
        assert path.exists(), f"{path} missing: run python deploy/grafana/dashboard.py"
        assert path.read_text() == text, f"{path} is stale: run python deploy/grafana/dashboard.py"


def test_check_flag_reports_stale_files(tmp_path, monkeypatch):
    assert dashboard.main(["--check"]) == 0
    stale = tmp_path / "apexrl.json"
    stale.write_text("{}\n")
    monkeypatch.setattr(dashboard, "DASHBOARD_JSON", stale)
    assert dashboard.main(["--check"]) == 1


# --- the dashboard --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def board() -> dict:
    return json.loads((GRAFANA / "apexrl.json").read_text())


def panels(board: dict) -> list[dict]:
    return [panel for panel in board["panels"] if panel["type"] != "row"]


def test_dashboard_is_loadable(board):
    assert board["uid"] == "apexrl" and board["title"]
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    assert len(panels(board)) >= 15
    for panel in panels(board):
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], f"{title}: no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{title}: refIds repeat"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{title}: empty query"
            assert target["datasource"] == panel["datasource"], title
        grid = panel["gridPos"]
        assert 0 < grid["w"] and grid["x"] + grid["w"] <= 24, f"{title}: {grid}"


def test_queries_are_plain_promql(board):
    """No Grafana macros or variables, so each query runs as it stands in Prometheus."""
    queries = dashboard.panel_queries()
    assert queries == [t["expr"] for p in panels(board) for t in p["targets"]]
    for expr in queries:
        assert "$" not in expr, expr
        assert expr.count("(") == expr.count(")"), expr


def catalogued_type(name: str, metrics: dict[str, str]) -> str | None:
    """The documented type of a queried series name (histogram series by their family)."""
    if name in metrics:
        return metrics[name]
    for suffix in HISTOGRAM_SUFFIXES:
        family = name.removesuffix(suffix)
        if family != name and "histogram" in metrics.get(family, ""):
            return metrics[family]
    return None


def test_every_queried_metric_is_catalogued():
    metrics = catalogue()
    assert metrics["apexrl_learner_td_error_mean"] == "gauge"  # the shorthands expand
    assert metrics["apexrl_replay_checkpoint_size_bytes"] == "gauge"
    assert metrics["apexrl_evaluation_return"] == "histogram"
    for expr in dashboard.panel_queries():
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        for name in names:
            assert catalogued_type(name, metrics), (
                f"{name} (in {expr!r}) is not in docs/metrics.md's metrics table"
            )


def test_counters_are_read_as_rates():
    """Counters and histograms through rate() (or increase(), or count() of their series: how
    many processes export one); gauges, including the gauge histogram of stored priorities, as
    levels."""
    metrics = catalogue()
    for expr in dashboard.panel_queries():
        for name in metric_names(expr):
            kind = catalogued_type(name, metrics)
            rated = re.search(rf"(rate|increase)\({re.escape(name)}\b", expr)
            counted = re.search(rf"\bcount\({re.escape(name)}\)", expr)
            if kind in ("counter", "histogram"):
                assert rated or counted, f"{name} is a {kind}: read it through rate(): {expr}"
            else:
                assert not rated, f"{name} is a {kind}, not a counter: {expr}"


def test_dashboard_covers_the_issue():
    """The panels the deployment issue asks for, by the metric each one reads."""
    queried = set().union(*(metric_names(expr) for expr in dashboard.panel_queries()))
    for name in [
        "apexrl_actor_env_steps_total",
        "apexrl_actor_episode_return_bucket",
        "apexrl_evaluation_mean_return",
        "apexrl_actor_epsilon",
        "apexrl_actor_noise_scale",
        "apexrl_evaluation_best_mean_return",
        "apexrl_replay_size",
        "apexrl_replay_capacity",
        "apexrl_replay_shard",
        "apexrl_replay_stored_bytes",
        "apexrl_replay_total_priority",
        "apexrl_replay_inserts_total",
        "apexrl_replay_samples_total",
        "apexrl_replay_priority_bucket",
        "apexrl_replay_sample_age_bucket",
        "apexrl_learner_updates_total",
        "apexrl_learner_loss",
        "apexrl_learner_td_error_mean",
        "apexrl_learner_prefetch_wait_fraction",
        "apexrl_actor_parameter_lag",
        "grpc_server_handling_seconds_bucket",
        "grpc_server_handled_total",
        "process_start_time_seconds",
    ]:
        assert name in queried, f"no panel reads {name}"


def test_replay_panels_show_the_shards_summed_and_each_shard():
    """Replay runs as shards, one pod each (replay-N, shard N): its size, memory and rates
    appear summed over the shards and split by pod."""
    queries = dashboard.panel_queries()
    for name in [
        "apexrl_replay_size",
        "apexrl_replay_stored_bytes",
        "apexrl_replay_inserts_total",
        "apexrl_replay_samples_total",
    ]:
        reading = [q for q in queries if name in metric_names(q)]
        per_shard = [q for q in reading if re.search(r"\bsum by \(pod\)", q)]
        summed = [q for q in reading if "pod" not in q]
        assert per_shard, f"no panel shows {name} per shard (sum by (pod))"
        assert [q for q in summed if q.startswith("sum")], f"no panel sums {name} over shards"


def test_restarts_come_from_the_processes_start_time(board):
    """No kube-state-metrics needed: a restart is a change of process_start_time_seconds."""
    restarts = [
        t["expr"] for p in panels(board) if "restart" in p["title"].lower() for t in p["targets"]
    ]
    assert restarts and all("changes(process_start_time_seconds" in e for e in restarts), restarts


# --- the ConfigMap --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def configmap() -> dict:
    docs = [d for d in yaml.safe_load_all((GRAFANA / "dashboard-configmap.yaml").read_text()) if d]
    assert len(docs) == 1
    return docs[0]


def test_configmap_is_picked_up_by_the_sidecar(configmap, board):
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["apexrl.json"]) == board


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_configmap_validates_strictly(configmap, version):
    try:
        kubernetes_validate.validate(configmap, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(p) for p in err.path)
        pytest.fail(
            f"dashboard ConfigMap is invalid for Kubernetes {version}: {path}: {err.message}"
        )
