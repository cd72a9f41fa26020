"""The learner's Prometheus metrics."""

import math
from collections.abc import Mapping

import prometheus_client


class LearnerMetrics:
    """The learner's own metrics, and a gauge per figure the algorithm reports
    (MetricNames.figures: apexrl_learner_<name>, with the builder's help)."""

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry,
        figures: Mapping[str, str] | None = None,
        loss_help: str = "Training loss of the last update.",
    ):
        def gauge(name, doc):
            return prometheus_client.Gauge(f"apexrl_learner_{name}", doc, registry=registry)

        def counter(name, doc):
            return prometheus_client.Counter(f"apexrl_learner_{name}", doc, registry=registry)

        self.updates = counter("updates", "Training updates (SGD steps) done by this process.")
        self.update_step = gauge("update_step", "Update step, kept across restarts.")
        self.loss = gauge("loss", loss_help)
        self.td_error = gauge(
            "td_error_mean", "Mean |TD error| of the last batch (algorithms with priorities)."
        )
        self.figures = {name: gauge(name, help) for name, help in (figures or {}).items()}
        self.weight_mean = gauge("is_weight_mean", "Mean importance weight of the last batch.")
        self.weight_min = gauge("is_weight_min", "Smallest importance weight of the last batch.")
        self.version = gauge("parameter_version", "Newest published parameter version.")
        self.parameter_bytes = gauge(
            "parameter_bytes", "Bytes of the newest version's parameters (a caller holding none)."
        )
        self.parameter_change_bytes = gauge(
            "parameter_change_bytes",
            "Bytes a caller holding the version before the newest pulls: the rows that changed"
            " (whole arrays where those are smaller).",
        )
        self.wait_fraction = gauge(
            "prefetch_wait_fraction",
            "Fraction of the last 100 updates' wall time the step waited for a batch.",
        )
        self.wait_seconds = counter("prefetch_wait_seconds", "Time the step waited for batches.")
        self.samples = counter("samples_consumed", "Transitions trained on.")
        self.priority_updates = counter("priority_updates_sent", "Priorities written to replay.")
        self.live_actors = gauge("live_actors", "Actors holding a lease.")
        self.live_file_failures = counter(
            "live_file_failures",
            "Reads of the live file (live_file) that failed or that held a refused value.",
        )
        self.parameter_bytes_sent = counter(
            "parameter_bytes_sent",
            "Bytes of the GetParameters answers sent (to actors, parameter relays, evaluators).",
        )
        self.decode_seconds = counter(
            "decode_seconds", "Time the input pipeline spent decompressing sampled frames."
        )
        self.decode_failures = counter(
            "decode_failures",
            "Sampled items dropped from their batch: their frames did not decompress to the"
            " column's size.",
        )
        self.policy_lag = gauge(
            "policy_lag",
            "Items that carry the version that acted: learner version minus their mean"
            " version, last batch.",
        )
        self.stale_items = counter(
            "stale_items_dropped",
            "Sampled items of an older version than the newest, not trained on (datasets that"
            " train on the newest version's items only).",
        )
        self.scheduled = prometheus_client.Gauge(
            "apexrl_learner_scheduled_setting",
            "A setting given a schedule or changed live (apexrl set), at the learner's step"
            " (label: the setting's name).",
            ["setting"],
            registry=registry,
        )
        self.pretrain_loss, self.pretrain_accuracy = pretrain_gauges(gauge)
        self.checkpoint_failures = counter(
            "checkpoint_failures", "Checkpoints that failed to write (previous ones kept)."
        )

    def report(self, figures: dict[str, float]) -> None:
        """An update's figures: "loss" and those the algorithm declared."""
        self.loss.set(figures["loss"])
        for name, gauge in self.figures.items():
            gauge.set(figures[name])


def pretrain_gauges(gauge) -> tuple[prometheus_client.Gauge, prometheus_client.Gauge]:
    """Behaviour cloning's final loss and accuracy, NaN until it has run (and without it)."""
    loss = gauge(
        "pretrain_loss",
        "Behaviour cloning's final loss, -log pi(a|s) over every demonstrated pair (NaN: none).",
    )
    accuracy = gauge(
        "pretrain_accuracy",
        "Share of the demonstrated pairs whose most likely action after behaviour cloning is"
        " the demonstrated one (NaN: none, or Box actions).",
    )
    loss.set(math.nan)
    accuracy.set(math.nan)
    return loss, accuracy
