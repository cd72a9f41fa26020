"""--tensorboard: scalars written as event files hold what was written, read back with
TensorBoard's own reader."""

import math
import subprocess
import sys

import prometheus_client
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from apexrl.common.tensorboard import RegistryScalars, Scalars


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in logdir's event files, by tag: (step, value) in the order written."""
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep them all
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_scalars_read_back_as_written_and_nan_is_skipped(tmp_path):
    scalars = Scalars(str(tmp_path))
    scalars.add({"eval_mean_return": math.nan, "env_steps": 0.0}, step=0)
    scalars.add({"eval_mean_return": 21.5, "env_steps": 1_200.0}, step=1_200)
    scalars.add({"eval_mean_return": 475.25, "env_steps": 9_000.0}, step=9_000)
    scalars.close()
    assert read_scalars(tmp_path) == {
        "eval_mean_return": [(1_200, 21.5), (9_000, 475.25)],
        "env_steps": [(0, 0.0), (1_200, 1_200.0), (9_000, 9_000.0)],
    }


def test_a_service_registry_is_written_at_each_new_step(tmp_path):
    registry = prometheus_client.CollectorRegistry()
    step = prometheus_client.Gauge("apexrl_learner_update_step", "", registry=registry)
    loss = prometheus_client.Gauge("apexrl_learner_loss", "", registry=registry)
    updates = prometheus_client.Counter("apexrl_learner_updates", "", registry=registry)
    prometheus_client.Gauge("apexrl_learner_by_table", "", ["table"], registry=registry)
    prometheus_client.Gauge("apexrl_other", "", registry=registry).set(3)
    scalars = RegistryScalars(
        registry, str(tmp_path), "apexrl_learner_", "apexrl_learner_update_step", "learner"
    )
    for update, value in ((10, 0.5), (20, 0.25)):
        step.set(update)
        loss.set(value)
        updates.inc(10)
        scalars.write()
    loss.set(9.0)
    scalars.write()  # the step has not moved: nothing written
    scalars.close()  # the final values, written only if the step moved: it has not
    assert read_scalars(tmp_path) == {
        "learner/update_step": [(10, 10.0), (20, 20.0)],
        "learner/loss": [(10, 0.5), (20, 0.25)],
        "learner/updates_total": [(10, 10.0), (20, 20.0)],
    }


def test_a_folder_that_cannot_be_written_is_refused_naming_the_setting(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=r"^tensorboard: cannot write to .*file/events"):
        Scalars(str(blocker / "events"))
    assert blocker.read_text() == "not a folder"


def test_writing_imports_no_torch(tmp_path):
    """Local mode's parent process writes event files and never imports torch."""
    code = (
        "import sys; from apexrl.common.tensorboard import Scalars;"
        f" s = Scalars({str(tmp_path)!r}); s.add({{'x': 1.0}}, 1); s.close();"
        " print(sorted(m for m in ('torch', 'tensorflow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert read_scalars(tmp_path) == {"x": [(1, 1.0)]}
