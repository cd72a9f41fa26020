"""The learner's Prometheus metrics."""

import prometheus_client


class LearnerMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry):
        def gauge(name, doc):
            return prometheus_client.Gauge(f"apexrl_learner_{name}", doc, registry=registry)

        def counter(name, doc):
            return prometheus_client.Counter(f"apexrl_learner_{name}", doc, registry=registry)

        self.updates = counter("updates", "Training updates (SGD steps) done by this process.")
        self.update_step = gauge("update_step", "Update step, kept across restarts.")
        self.loss = gauge("loss", "Importance-weighted Huber loss of the last update.")
        self.td_error = gauge("td_error_mean", "Mean |TD error| of the last batch.")
        self.q_mean = gauge("q_mean", "Mean Q(s, a) of the last batch.")
        self.weight_mean = gauge("is_weight_mean", "Mean importance weight of the last batch.")
        self.weight_min = gauge("is_weight_min", "Smallest importance weight of the last batch.")
        self.version = gauge("parameter_version", "Newest published parameter version.")
        self.wait_fraction = gauge(
            "prefetch_wait_fraction",
            "Fraction of the last 100 updates' wall time the step waited for a batch.",
        )
        self.wait_seconds = counter("prefetch_wait_seconds", "Time the step waited for batches.")
        self.samples = counter("samples_consumed", "Transitions trained on.")
        self.priority_updates = counter("priority_updates_sent", "Priorities written to replay.")
        self.live_actors = gauge("live_actors", "Actors holding a lease.")
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
            "impala, ppo: learner version minus the mean version that acted, last batch.",
        )
        self.stale_unrolls = counter(
            "stale_unrolls_dropped", "ppo: sampled unrolls of an older version, not trained on."
        )
        self.checkpoint_failures = counter(
            "checkpoint_failures", "Checkpoints that failed to write (previous ones kept)."
        )
