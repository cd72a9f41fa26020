"""deploy/k8s/autoscaling: the actors scale on the actor demand ratio, through KEDA or through
an HPA on prometheus-adapter's external metric.

Checked here without a cluster: the ScaledObject against KEDA's published CRD models
(cloudcoil-models-keda, generated from KEDA's CRDs; a field they do not know fails), the HPA
against the Kubernetes OpenAPI schemas in strict mode, the adapter's rules against its
config types (kubernetes-sigs/prometheus-adapter pkg/config/config.go); that both ways run
the same query; that every threshold is above 0; and the query itself on Prometheus's own
engine (promtool test rules) in the two states it must tell apart: too few actors (the
learner waits) and too many (the rate limiter holds their inserts). The podman test
(tests/e2e/test_kubernetes.py) evaluates it on a real Prometheus scraping the real services.
"""

import copy
import importlib.util
import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda import v1alpha1 as keda

from tests.deploy import test_manifests as tm

FOLDER = tm.K8S / "autoscaling"
NAMESPACE_MATCHER = f'namespace="{tm.NAMESPACE}"'
METRIC = "apexrl_actor_demand_ratio"
# The HPA (KEDA's too) leaves the replica count alone within 10% of the target (its
# --horizontal-pod-autoscaler-tolerance default): these are where it starts to act.
SCALE_UP_ABOVE, SCALE_DOWN_BELOW = 1.1, 0.9

# kubernetes-sigs/prometheus-adapter pkg/config/config.go (DiscoveryRule and what it holds),
# as a JSON Schema: the adapter refuses a config that does not parse into these types.
_GROUP_RESOURCE = {
    "type": "object",
    "properties": {"group": {"type": "string"}, "resource": {"type": "string"}},
    "required": ["resource"],
    "additionalProperties": False,
}
DISCOVERY_RULE = {
    "type": "object",
    "properties": {
        "seriesQuery": {"type": "string", "minLength": 1},
        "seriesFilters": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"is": {"type": "string"}, "isNot": {"type": "string"}},
                "additionalProperties": False,
                "maxProperties": 1,
            },
        },
        "resources": {
            "type": "object",
            "properties": {
                "template": {"type": "string"},
                "overrides": {"type": "object", "additionalProperties": _GROUP_RESOURCE},
            },
            "additionalProperties": False,
        },
        "name": {
            "type": "object",
            "properties": {"matches": {"type": "string"}, "as": {"type": "string"}},
            "additionalProperties": False,
        },
        "metricsQuery": {"type": "string"},
        "labelValueReplacements": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"find": {"type": "string"}, "replace": {"type": "string"}},
                "additionalProperties": False,
            },
        },
    },
    "required": ["seriesQuery"],
    "additionalProperties": False,
}
# The chart's values that carry the rules (prometheus-community/prometheus-adapter).
ADAPTER_VALUES = {
    "type": "object",
    "properties": {
        "prometheus": {
            "type": "object",
            "properties": {
                "url": {"type": "string"},
                "port": {"type": "integer"},
                "path": {"type": "string"},
            },
            "additionalProperties": False,
        },
        "rules": {
            "type": "object",
            "properties": {
                "default": {"type": "boolean"},
                "custom": {"type": "array", "items": DISCOVERY_RULE},
                "external": {"type": "array", "items": DISCOVERY_RULE},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}


def load(name: str) -> dict:
    (doc,) = tm.load_yaml(FOLDER / name)
    return doc


def scaled_object() -> dict:
    return load("keda-scaledobject.yaml")


def keda_query() -> str:
    (trigger,) = scaled_object()["spec"]["triggers"]
    return trigger["metadata"]["query"]


def adapter_rule() -> dict:
    (rule,) = load("prometheus-adapter-values.yaml")["rules"]["external"]
    return rule


def check_thresholds(scaled: dict, hpa: dict) -> None:
    """ValueError naming the field for a scaling threshold that is not above 0: at 0 or below
    the ratio over it is infinite or negative, so the actors would go to the maximum or the
    minimum whatever the learner needs."""

    def positive(text: str) -> bool:  # a number or a Kubernetes quantity ("1", "500m")
        number = re.fullmatch(r"([-+]?[0-9.]+)[a-zA-Z]*", str(text).strip())
        return number is not None and float(number[1]) > 0

    for i, trigger in enumerate(scaled["spec"]["triggers"]):
        if not positive(trigger["metadata"].get("threshold", "")):
            raise ValueError(
                f"ScaledObject {scaled['metadata']['name']}: spec.triggers[{i}].metadata."
                f"threshold must be > 0, got {trigger['metadata'].get('threshold')!r}"
            )
    for i, metric in enumerate(hpa["spec"]["metrics"]):
        target = metric[metric["type"][0].lower() + metric["type"][1:]]["target"]
        if not positive(target.get("value", target.get("averageValue", ""))):
            raise ValueError(
                f"HorizontalPodAutoscaler {hpa['metadata']['name']}: spec.metrics[{i}]."
                f"{metric['type'].lower()}.target must be > 0, got {target!r}"
            )


# --- schemas -------------------------------------------------------------------------------


def test_scaled_object_is_a_valid_keda_scaled_object():
    doc = scaled_object()
    parsed = keda.ScaledObject.model_validate(doc)
    # The models ignore unknown fields: what they do not give back was not KEDA's.
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc
    spec = doc["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "actor",
    }
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (30, 300)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    (trigger,) = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "Value")


def test_the_keda_check_sees_a_misspelt_field():
    doc = scaled_object()
    doc["spec"]["pollingIntervall"] = 30
    parsed = keda.ScaledObject.model_validate(doc)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") != doc


@pytest.mark.parametrize("version", tm.K8S_VERSIONS)
def test_hpa_validates_strictly(version):
    kubernetes_validate.validate(load("hpa.yaml"), version, strict=True)


def test_hpa_scales_the_actors_on_the_adapters_metric():
    spec = load("hpa.yaml")["spec"]
    scaled = scaled_object()["spec"]
    assert spec["scaleTargetRef"] == scaled["scaleTargetRef"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (
        scaled["minReplicaCount"],
        scaled["maxReplicaCount"],
    )
    assert spec["behavior"] == scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    (metric,) = spec["metrics"]
    assert metric["external"]["metric"]["name"] == adapter_rule()["name"]["as"] == METRIC
    assert metric["external"]["target"] == {"type": "Value", "value": "1"}


def test_adapter_values_follow_the_adapters_config_types():
    jsonschema.validate(load("prometheus-adapter-values.yaml"), ADAPTER_VALUES)
    broken = copy.deepcopy(load("prometheus-adapter-values.yaml"))
    broken["rules"]["external"][0]["metricQuery"] = "1"
    with pytest.raises(jsonschema.ValidationError, match="metricQuery"):
        jsonschema.validate(broken, ADAPTER_VALUES)


def test_keda_and_the_adapter_run_the_same_query():
    rule = adapter_rule()
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}}
    # The adapter fills <<.LabelMatchers>> with the HPA's namespace for an external metric.
    expanded = rule["metricsQuery"].replace("<<.LabelMatchers>>", NAMESPACE_MATCHER)
    assert "<<" not in expanded
    assert " ".join(expanded.split()) == " ".join(keda_query().split())
    series = re.match(r"(\w+)\{", rule["seriesQuery"])[1]
    assert re.fullmatch(rule["name"]["matches"], series) and series in rule["metricsQuery"]


def test_the_query_reads_documented_metrics():
    documented = tm.readme_metrics()
    used = {re.sub(r"_(sum|count|bucket)$", "", m) for m in tm.promql_metrics(keda_query())}
    assert used <= documented, used - documented


# --- bad input -----------------------------------------------------------------------------


def test_shipped_thresholds_are_above_zero():
    check_thresholds(scaled_object(), load("hpa.yaml"))


@pytest.mark.parametrize("value", ["0", "-1", "-0.5"])
def test_a_threshold_at_or_below_zero_is_refused_naming_it(value):
    scaled, hpa = scaled_object(), load("hpa.yaml")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = value
    with pytest.raises(ValueError, match=r"spec\.triggers\[0\]\.metadata\.threshold must be > 0"):
        check_thresholds(scaled, hpa)
    scaled, hpa = scaled_object(), load("hpa.yaml")
    hpa["spec"]["metrics"][0]["external"]["target"]["value"] = value
    with pytest.raises(ValueError, match=r"spec\.metrics\[0\]\.external\.target must be > 0"):
        check_thresholds(scaled, hpa)


# --- the query in both states, on Prometheus's engine --------------------------------------

# Per state: input series at 1-minute steps (counters growing by the given seconds each
# minute), the ratio the query must give after 10 minutes, and which side of the HPA's
# tolerance that is.
STATES = {
    # 2 actors; the learner waits 36 s a minute for batches, no insert is held.
    "too few actors": (
        {
            "apexrl_learner_prefetch_wait_seconds_total": [36],
            "apexrl_replay_rate_limiter_wait_seconds_sum{operation='insert'}": [0],
            "apexrl_actor_env_steps_total": [600, 600],
        },
        1.6,
        "up",
    ),
    # 4 actors over 2 shards; the learner never waits, the shards hold inserts 45 s and 90 s
    # a minute (135 s a minute over 4 actors: each waits 56% of the time).
    "too many actors": (
        {
            "apexrl_learner_prefetch_wait_seconds_total": [0],
            "apexrl_replay_rate_limiter_wait_seconds_sum{operation='insert'}": [45, 90],
            "apexrl_actor_env_steps_total": [600, 600, 600, 600],
        },
        1 - 135 / 60 / 4,
        "down",
    ),
    # Matched: the learner waits 3 s a minute, 2 actors 3 s a minute in all.
    "matched": (
        {
            "apexrl_learner_prefetch_wait_seconds_total": [3],
            "apexrl_replay_rate_limiter_wait_seconds_sum{operation='insert'}": [3],
            "apexrl_actor_env_steps_total": [600, 600],
        },
        1 + 3 / 60 - 3 / 60 / 2,
        "stay",
    ),
}


def series(state: dict) -> list[dict]:
    out = []
    for name, slopes in state.items():
        metric, _, labels = name.partition("{")
        labels = labels.rstrip("}").replace("'", '"')
        for i, slope in enumerate(slopes):
            matchers = ",".join(m for m in (NAMESPACE_MATCHER, f'pod="p{i}"', labels) if m)
            out.append({"series": f"{metric}{{{matchers}}}", "values": f"0+{slope}x10"})
    return out


def test_the_query_tells_too_few_actors_from_too_many(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: apt-get install prometheus (.ci/run does)"
    rules = {"groups": [{"name": "demand", "rules": [
        {"record": "apexrl:actor_demand:ratio", "expr": " ".join(keda_query().split())}]}]}  # fmt: skip
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests = []
    for name, (state, ratio, way) in STATES.items():
        where = {"up": ratio > SCALE_UP_ABOVE, "down": ratio < SCALE_DOWN_BELOW}
        assert where.get(way, SCALE_DOWN_BELOW <= ratio <= SCALE_UP_ABOVE), (name, ratio)
        tests.append({
            "name": name,
            "interval": "1m",
            "input_series": series(state),
            "promql_expr_test": [{"expr": "apexrl:actor_demand:ratio", "eval_time": "10m",
                                  "exp_samples": [{"labels": "apexrl:actor_demand:ratio",
                                                   "value": ratio}]}],
        })  # fmt: skip
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": tests})
    )
    result = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_shows_the_query_the_autoscalers_run():
    spec = importlib.util.spec_from_file_location("dashboard", tm.DEPLOY / "grafana/dashboard.py")
    dashboard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dashboard)
    keda = re.sub(rf"{NAMESPACE_MATCHER},?", "", keda_query()).replace("{}", "")
    assert " ".join(dashboard.ACTOR_DEMAND.split()) == " ".join(keda.split())
    assert dashboard.ACTOR_DEMAND in dashboard.panel_queries()
