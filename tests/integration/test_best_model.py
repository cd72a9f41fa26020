"""The best model: what an evaluation scored is what the learner keeps and `apexrl eval` plays.

Real learner processes; reports sent through the shipping LearnerClient, as the evaluator does.
"""

import math
import subprocess
import sys

import grpc
import numpy as np
import pytest

from apexrl.common import checkpoint, codec
from apexrl.common.learner_client import LearnerClient
from tests.conftest import wait_for

ENV = "CartPole-v1"


def report(client: LearnerClient, params, returns, **protocol):
    protocol = {"env": ENV, "first_seed": 7, "epsilon": 0.0} | protocol
    return client.report_evaluation(params, np.array(returns, float), **protocol)


def best_files(directory) -> list:
    return checkpoint.checkpoints(directory, "best")


def test_the_best_report_is_kept_with_exactly_its_parameters_and_survives_a_restart(
    service_process, filled_replay, tmp_path
):
    ckpt = tmp_path / "learner"
    learner = service_process("learner", "--replay", filled_replay.address,
                              "--checkpoint-dir", str(ckpt), "--publish-interval", "5")  # fmt: skip
    with LearnerClient(learner.address) as client:
        first = client.get_parameters()
        answer = report(client, first, [10.0, 20.0])
        assert (answer.kept, answer.best_version, answer.best_mean_return) == (
            True,
            first.version,
            15,
        )
        # Later versions (the learner trains meanwhile): lower and equal scores are not kept.
        later = wait_for(
            lambda: (
                (p := client.get_parameters(first.version, have_lineage=first.lineage)).arrays and p
            ),
            60,
            "a newer version",
        )
        assert not report(client, later, [5.0, 5.0]).kept
        assert not report(client, later, [15.0, 15.0]).kept  # a tie keeps the earlier version
        assert len(best_files(ckpt)) == 1
        answer = report(client, later, [30.0, 32.0, 34.0], first_seed=100, epsilon=0.01)
        assert (answer.kept, answer.best_version, answer.best_mean_return) == (
            True,
            later.version,
            32,
        )

    path, meta, arrays = checkpoint.load_newest(ckpt, "best")
    assert {k: meta[k] for k in ("version", "lineage", "update_step", "mean_return", "returns")} == {
        "version": later.version, "lineage": later.lineage, "update_step": later.update_step,
        "mean_return": 32.0, "returns": [30.0, 32.0, 34.0],
    }  # fmt: skip
    assert meta["protocol"] == {"env": ENV, "episodes": 3, "first_seed": 100, "epsilon": 0.01}
    assert set(arrays) == {f"online/{name}" for name in later.arrays}
    for name, value in later.arrays.items():  # the very parameters that were played
        np.testing.assert_array_equal(arrays[f"online/{name}"], value)

    learner.stop()  # its final checkpoint goes beside the best model, which it leaves alone
    assert checkpoint.load_newest(ckpt, "best")[0] == path
    learner = service_process("learner", "--replay", filled_replay.address,
                              "--checkpoint-dir", str(ckpt))  # fmt: skip
    assert "best model so far: version" in learner.log()
    with LearnerClient(learner.address) as client:
        now = client.get_parameters()
        answer = report(client, now, [31.0])
        assert (answer.kept, answer.best_version, answer.best_mean_return) == (
            False,
            later.version,
            32,
        )
    learner.stop()

    # `apexrl eval` on the directory plays the best model and says which version that is.
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(ckpt), "--episodes", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    header = played.stdout.splitlines()[0]
    assert header.startswith(f"{path}: {ENV}, version {later.version} (update {later.update_step})")
    assert "the best model: scored 32.0 over 3 evaluator episodes" in header
    latest = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "eval", "--checkpoint", str(ckpt), "--episodes", "3",
         "--latest"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.startswith(str(checkpoint.checkpoints(ckpt, "learner")[-1][1]))


def _bad(params, arrays):
    """Requests that must be refused, each with the field its message must name."""
    wrong_shape = dict(arrays)
    name = sorted(arrays)[0]
    wrong_shape[name] = np.zeros((3, 3), np.float32)
    wrong_dtype = dict(arrays)
    wrong_dtype[name] = arrays[name].astype(np.float64)
    compressed = dict(arrays)
    compressed[name] = codec.compress(arrays[name])  # the right dtype and shape, as zstd items
    return [
        ("version", dict(version=0), {}, [1.0]),
        ("returns", {}, {}, []),
        ("returns", {}, {}, [1.0, math.nan]),
        ("returns", {}, {}, [math.inf]),
        ("env", {}, {"env": "Acrobot-v1"}, [1.0]),
        ("parameters", dict(arrays={}), {}, [1.0]),
        ("parameters", dict(arrays={**arrays, "extra": np.zeros(2, np.float32)}), {}, [1.0]),
        (f'parameters["{name}"]', dict(arrays=wrong_shape), {}, [1.0]),
        (f'parameters["{name}"]', dict(arrays=wrong_dtype), {}, [1.0]),
        (f'parameters["{name}"].codec', dict(arrays=compressed), {}, [1.0]),
    ]


def test_bad_reports_are_refused_naming_the_field_and_change_nothing(
    service_process, filled_replay, tmp_path
):
    ckpt = tmp_path / "learner"
    learner = service_process("learner", "--replay", filled_replay.address,
                              "--checkpoint-dir", str(ckpt))  # fmt: skip
    with LearnerClient(learner.address) as client:
        params = client.get_parameters()
        assert report(client, params, [50.0]).kept
        kept = best_files(ckpt)
        for field, change, protocol, returns in _bad(params, params.arrays):
            bad = type(params)(**{**params.__dict__, **change})
            with pytest.raises(grpc.RpcError) as caught:
                report(client, bad, returns, **protocol)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, change)
            assert caught.value.details().startswith(f"{field}:"), caught.value.details()
        assert best_files(ckpt) == kept
        answer = report(client, params, [40.0])  # the best is still the one kept above
        assert (answer.kept, answer.best_mean_return) == (False, 50.0)
    learner.stop()


def test_a_learner_without_a_checkpoint_dir_says_it_cannot_keep_the_best_model(
    service_process, filled_replay
):
    learner = service_process("learner", "--replay", filled_replay.address)
    with LearnerClient(learner.address) as client:
        with pytest.raises(grpc.RpcError) as caught:
            report(client, client.get_parameters(), [1.0])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details().startswith("checkpoint_dir:")
    learner.stop()
