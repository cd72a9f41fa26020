"""`apexrl learner --tensorboard DIR`: a real learner process writes its metrics as event files,
and what they hold at the end is what its /metrics said when it stopped."""

import pytest

from tests.conftest import metric, wait_for
from tests.unit.test_tensorboard import read_scalars

pytestmark = pytest.mark.slow


def test_the_learner_writes_its_gauges_at_its_update_steps(
    service_process, filled_replay, tmp_path
):
    events = tmp_path / "tb"
    learner = service_process("learner", "--replay", filled_replay.address, "--batch-size", "32",
                              "--tensorboard", str(events), "--max-updates", "300")  # fmt: skip
    wait_for(lambda: metric(learner.metrics_port, "apexrl_learner_update_step") >= 300, 120,
             "300 updates")  # fmt: skip
    version = metric(learner.metrics_port, "apexrl_learner_parameter_version")
    learner.stop()  # SIGTERM: the writer's last values reach the file
    scalars = read_scalars(events)
    steps = [step for step, _ in scalars["learner/update_step"]]
    assert steps == sorted(set(steps)) and steps[-1] == 300
    assert all(value == step for step, value in scalars["learner/update_step"])
    assert scalars["learner/parameter_version"][-1] == (300, version)
    assert {"learner/loss", "learner/updates_total", "learner/samples_consumed_total"} <= set(
        scalars
    )
