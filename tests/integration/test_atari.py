"""Atari through the real services: actors compress stacked frames, the replay stores and
checks them without a codec, the learner decodes them off the training thread."""

import queue

import ale_py  # noqa: F401  (make setup installs it: missing, these tests fail, never skip)
import grpc
import numpy as np
import prometheus_client
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl import algorithms
from apexrl.algorithms.base import Policy
from apexrl.algorithms.columns import unpack
from apexrl.algorithms.r2d2.builder import R2D2Builder
from apexrl.common import codec
from apexrl.common.codec import Packed
from apexrl.common.parameters import ParameterStore
from apexrl.config import AgentConfig, LearnerConfig
from apexrl.learner.device import autocast_dtype, native_bfloat16
from apexrl.learner.metrics import LearnerMetrics
from apexrl.learner.training import Learner
from apexrl.replay.client import ReplayClient, SampledBatch, insert_request
from tests.conftest import in_process_replay, metric, wait_for

PONG = "ALE/Pong-v5"


def signature() -> str:
    return ",".join(c.spec() for c in algorithms.transition_columns(AgentConfig(env=PONG)))


def test_pong_transitions_flow_compressed_from_actor_to_learner(service_process):
    replay = service_process("replay", "--signature", signature(), "--min-size-to-sample", "64")
    learner = service_process(
        "learner", "--env", PONG, "--replay", replay.address, "--batch-size", "16",
        "--max-updates", "5", "--publish-interval", "1",
    )  # fmt: skip
    actor = service_process(
        "actor", "--env", PONG, "--replay", replay.address, "--learner", learner.address,
        "--num-envs", "2", "--insert-batch", "32",
    )  # fmt: skip
    wait_for(
        lambda: metric(learner.metrics_port, "apexrl_learner_update_step") >= 5, 120, "5 updates"
    )
    assert metric(learner.metrics_port, "apexrl_learner_decode_failures_total") == 0
    assert metric(learner.metrics_port, "apexrl_learner_decode_seconds_total") > 0
    with ReplayClient(replay.address) as client:
        info = client.info()
        batch = client.sample(32)
    assert info.signature[0].codec == 1  # ZSTD: the replay knows the column is compressed
    # Everything the table holds per item, frames included, is a small fraction of the raw
    # 56,448 bytes of an obs / next_obs pair.
    assert info.stored_bytes / info.size < 2_000, info.stored_bytes / info.size
    assert isinstance(batch.columns["observations"], Packed)
    columns = algorithms.transition_columns(AgentConfig(env=PONG))
    fields, ok = unpack(batch.columns, columns)
    assert ok.all()
    assert fields["obs"].shape == (32, 4, 84, 84) and fields["obs"].any()
    # n = 3: the newest frame of obs is the oldest of next_obs (full windows, nearly all).
    assert (fields["next_obs"][:, 0] == fields["obs"][:, 3]).all(axis=(1, 2)).mean() > 0.8
    # Rewards are clipped per step for learning: an n-step return is at most 1 + g + g^2.
    assert np.abs(fields["reward"]).max() <= 3.0
    actor.stop()
    learner.stop()
    replay.stop()


def test_replay_refuses_frames_it_cannot_trust_and_keeps_its_items(service_process):
    replay = service_process(
        "replay", "--signature", "observations:uint8:2x4x84x84:zstd,action:int64:"
    )
    frames = np.zeros((2, 2, 4, 84, 84), np.uint8)
    good = {"observations": codec.compress(frames), "action": np.arange(2)}
    bomb = codec.compress(np.zeros((2, 2, 4, 84, 840), np.uint8))
    with ReplayClient(replay.address, retry_seconds=0) as client:
        client.insert(good)
        for frames_ in (
            Packed.join("zstd", np.uint8, (2, 4, 84, 84), [b"\x00" * 40] * 2),
            Packed.join("zstd", np.uint8, (2, 4, 84, 84), bomb.items()),
        ):
            with pytest.raises(grpc.RpcError) as err:
                client.insert(good | {"observations": frames_})
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert 'batch.columns["observations"]' in err.value.details()
        info = client.info()
    assert (info.size, info.inserts) == (2, 2)
    replay.stop()


def test_learner_drops_items_whose_frames_do_not_decode():
    config = LearnerConfig(env=PONG, device="cpu")
    registry = prometheus_client.CollectorRegistry()
    learner = Learner(config, algorithms.make(config), LearnerMetrics(registry), ParameterStore())
    obs = np.random.default_rng(0).integers(0, 255, (3, 2, 4, 84, 84), dtype=np.uint8)
    frames = codec.compress(obs).items()
    frames[1] = frames[1][:-10]  # truncated in transit or on disk
    batch = SampledBatch(
        columns={
            "observations": Packed.join("zstd", np.uint8, (2, 4, 84, 84), frames),
            "action": np.arange(3),
            "reward": np.zeros(3, np.float32),
            "discount": np.ones(3, np.float32),
        },
        keys=np.array([10, 11, 12]),
        probabilities=np.full(3, 1 / 3),
        weights=np.array([1.0, 0.5, 0.25], np.float32),
        table_size=3,
    )
    columns, weights, keys = learner.to_device(batch)
    assert keys.tolist() == [10, 12]
    assert weights.tolist() == [1.0, 0.25]
    np.testing.assert_array_equal(columns["obs"].numpy(), obs[[0, 2], 0])
    np.testing.assert_array_equal(columns["next_obs"].numpy(), obs[[0, 2], 1])
    assert registry.get_sample_value("apexrl_learner_decode_failures_total") == 1


def pong_learner(**settings) -> Learner:
    config = LearnerConfig(env=PONG, device="cpu", **settings)
    registry = prometheus_client.CollectorRegistry()
    return Learner(config, algorithms.make(config), LearnerMetrics(registry), ParameterStore())


def test_a_bfloat16_update_keeps_float32_state_and_float32s_priorities_within_its_precision():
    """precision bfloat16 runs the update's passes under autocast: the weights, their gradients
    and Adam's state stay float32, and the new priorities and the step stay those of float32 to
    bfloat16's precision (8 bits of mantissa)."""
    rng = np.random.default_rng(0)
    n = 32
    columns = {
        "obs": torch.from_numpy(rng.integers(0, 255, (n, 4, 84, 84), dtype=np.uint8)),
        "next_obs": torch.from_numpy(rng.integers(0, 255, (n, 4, 84, 84), dtype=np.uint8)),
        "action": torch.from_numpy(rng.integers(0, 6, n)),
        "reward": torch.from_numpy(rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32)),
        "discount": torch.full((n,), 0.97),
    }
    priorities, steps = {}, {}
    for precision in ("float32", "bfloat16"):
        learner = pong_learner(precision=precision, seed=1)
        before = [p.detach().clone() for p in learner.learning.online.parameters()]
        sink = queue.Queue()
        learner._update(columns, torch.ones(n), np.arange(n), sink)
        priorities[precision] = sink.get_nowait()[1]
        after = list(learner.learning.online.parameters())
        steps[precision] = torch.cat(
            [(a.detach() - b).flatten() for a, b in zip(after, before, strict=True)]
        )
        state = [t for s in learner.learning.optimizer.state.values() for t in s.values()]
        assert {p.dtype for p in after} | {p.grad.dtype for p in after} == {torch.float32}
        assert {t.dtype for t in state if t.dim()} == {torch.float32}
    np.testing.assert_allclose(priorities["bfloat16"], priorities["float32"], atol=0.005)
    assert not np.array_equal(priorities["bfloat16"], priorities["float32"])  # autocast ran
    agree = (steps["bfloat16"].sign() == steps["float32"].sign()).float().mean().item()
    assert agree > 0.95, f"only {agree:.1%} of the weights stepped the same way"


def test_r2d2_bfloat16_updates_give_float32s_priorities_within_its_precision():
    """r2d2 rescales its targets (h and h^-1 cancel digits): under a bfloat16 autocast its
    priorities stay float32's to bfloat16's precision, on Pong sequences of rewards -1, 0, 1."""
    settings = R2D2Builder.Settings(**R2D2Builder.presets(PONG)["r2d2"])  # LSTM 256, 20 steps
    rng = np.random.default_rng(0)
    n, steps = 8, settings.sequence_length
    columns = {
        "observations": torch.from_numpy(
            rng.integers(0, 255, (n, steps + 1, 4, 84, 84), dtype=np.uint8)),
        "actions": torch.from_numpy(rng.integers(0, 6, (n, steps))),
        "rewards": torch.from_numpy(rng.choice([-1.0, 0.0, 1.0], (n, steps)).astype(np.float32)),
        "discounts": torch.full((n, steps), 0.99),
        "mask": torch.ones(n, steps),
        "state": torch.from_numpy(rng.normal(0, 0.1, (n, 2 * settings.lstm_size)).astype(np.float32)),
    }  # fmt: skip
    priorities = {}
    for precision in ("float32", "bfloat16"):
        learner = pong_learner(algorithm="r2d2", algo=settings, precision=precision, seed=1)
        sink = queue.Queue()
        learner._update(columns, torch.ones(n), np.arange(n), sink)
        priorities[precision] = sink.get_nowait()[1]
    np.testing.assert_allclose(priorities["bfloat16"], priorities["float32"], rtol=0.02)
    assert not np.array_equal(priorities["bfloat16"], priorities["float32"])  # autocast ran


@pytest.mark.parametrize("precision", ["float16", "bf16", ""])
def test_an_unknown_precision_is_refused_naming_the_setting(precision):
    with pytest.raises(ValueError, match="precision must be float32, bfloat16 or auto"):
        pong_learner(precision=precision)


def test_auto_precision_is_bfloat16_exactly_where_the_cpu_computes_it():
    assert autocast_dtype("auto", torch.device("cpu")) == (
        torch.bfloat16 if native_bfloat16(torch.device("cpu")) else None
    )
    assert autocast_dtype("float32", torch.device("cpu")) is None
    assert autocast_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


@pytest.fixture(scope="module")
def compressed_replay(tmp_path_factory):
    with in_process_replay(
        tmp_path_factory.mktemp("replay"), signature="observations:uint8:2x4x8x8:zstd,action:int64:"
    ) as harness:
        yield harness


def zstd_declares(frame: bytes, nbytes: int) -> bool:
    """The oracle: zstandard's own frame header parser reads `frame` as a zstd frame (not a
    skippable one, which it parses too) declaring `nbytes` decompressed and no dictionary."""
    if frame[:4] != codec.ZSTD_MAGIC:
        return False
    try:
        parameters = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError:
        return False
    return parameters.content_size == nbytes and parameters.dict_id == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compressed_inserts_fuzzed_are_stored_exactly_or_refused_naming_the_column(
    compressed_replay, data
):
    """Random damage to a valid compressed insert (header bytes, truncation, sizes, shape,
    codec): the replay accepts it exactly when zstandard's own frame parser reads every frame
    as declaring the item size, and then stores each frame byte for byte; else it answers
    INVALID_ARGUMENT naming the column and keeps its table byte for byte."""
    harness = compressed_replay
    n = data.draw(st.integers(1, 4))
    items = np.zeros((n, 2, 4, 8, 8), np.uint8)
    items[:, :, :, 2, 3] = np.arange(n)[:, None, None]
    frames = codec.compress(items).items()
    i = data.draw(st.integers(0, n - 1))
    damage = data.draw(st.sampled_from(["header", "truncate", "junk", "none"]))
    frame = bytearray(frames[i])
    if damage == "header":
        at = data.draw(st.integers(0, min(len(frame), 14) - 1))
        frame[at] ^= data.draw(st.integers(1, 255))
    elif damage == "truncate":
        frame = frame[: data.draw(st.integers(0, len(frame) - 1))]
    elif damage == "junk":
        frame = bytearray(data.draw(st.binary(max_size=40)))
    frames[i] = bytes(frame)
    request = insert_request(
        "default",
        {
            "observations": Packed.join("zstd", np.uint8, (2, 4, 8, 8), frames),
            "action": np.arange(n),
        },
        None,
    )
    tensor = request.batch.columns["observations"]
    if data.draw(st.booleans()):  # damage the tensor's framing too
        what = data.draw(st.sampled_from(["sizes", "shape", "codec"]))
        if what == "sizes":
            tensor.sizes[0] = max(0, tensor.sizes[0] + data.draw(st.integers(-3, 3)))
        elif what == "shape":
            tensor.shape[-1] += 1
        else:
            tensor.codec = data.draw(st.integers(0, 3))
    well_framed = (
        list(tensor.shape) == [n, 2, 4, 8, 8]
        and tensor.codec == 1
        and sum(tensor.sizes) == len(tensor.data)
    )
    sent = Packed(
        "zstd", np.uint8, (2, 4, 8, 8), tensor.data, np.array(tensor.sizes, np.uint32)
    ).items()
    declared_ok = well_framed and all(zstd_declares(bytes(f), 2 * 4 * 8 * 8) for f in sent)
    table = harness.table
    before = table.digest()
    inserts = table.inserts
    with harness.client(retry_seconds=0) as client:
        try:
            list(client.stub.Insert(iter([request]), timeout=10))
            error = None
        except grpc.RpcError as err:
            error = err
    if declared_ok:
        assert error is None, error.details()
        assert table.inserts == inserts + n
        slots = np.arange(inserts, inserts + n) % table.capacity
        stored = table.columns["observations"]
        for slot, frame in zip(slots.tolist(), sent, strict=True):
            offset, size = int(stored.offsets[slot]), int(stored.sizes[slot])
            assert bytes(memoryview(stored.blobs[slot])[offset : offset + size]) == bytes(frame)
        np.testing.assert_array_equal(table.columns["action"][slots], np.arange(n))
    else:
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith('batch.columns["observations"]'), error.details()
        assert table.digest() == before


class RandomPolicy(Policy):
    """Uniformly random actions."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def load(self, arrays) -> None:
        pass

    def priorities(self, items):
        return np.ones(len(next(iter(items.values()))))

    def act(self, obs, exploration, rng):
        return rng.integers(self.num_actions, size=len(obs))


def test_an_evaluation_scores_the_game_unclipped(monkeypatch):
    """Space Invaders pays 5 to 30 points an alien: the return an evaluation reports is the
    sum of the rewards the emulator paid, step by step, not of rewards clipped to +-1 (which
    actors learn from)."""
    from apexrl.algorithms import evaluation
    from apexrl.algorithms.envs import make_env

    paid: list[float] = []

    def recording_env(env_id, options):
        env = make_env(env_id, options)
        game = env.unwrapped
        step = game.step

        def counted(action):
            result = step(action)
            paid.append(float(result[1]))
            return result

        game.step = counted
        return env

    monkeypatch.setattr(evaluation, "make_env", recording_env)
    env_id = "ALE/SpaceInvaders-v5"
    returns = evaluation.evaluate(RandomPolicy(6), env_id, episodes=1, seed=3)
    assert max(paid) > 1  # rewards clipping would change
    assert returns[0] == sum(paid)


def test_a_lost_life_ends_the_returns_of_breakout_actors_with_life_loss_terminal(service_process):
    """Two Breakout actors, each alone on its learner (epsilon 0.4 both), one with
    life_loss_terminal: its 1-step transitions end (discount 0) at each of the game's 5 lives,
    the other's at game overs only, so its share of ended transitions is about 5 times the
    other's."""
    env = "ALE/Breakout-v5"
    columns = algorithms.transition_columns(AgentConfig(env=env))
    sig = ",".join(c.spec() for c in columns)
    processes, clients = [], {}
    for ends in (True, False):
        replay = service_process("replay", "--signature", sig, "--alpha", "0",  # uniform draws
                                 "--min-size-to-sample", "1")  # fmt: skip
        learner = service_process("learner", "--env", env, "--replay", replay.address,
                                  "--batch-size", "1", "--max-updates", "1",
                                  "--priority-exponent", "0")  # fmt: skip
        actor = service_process(
            "actor", "--env", env, "--replay", replay.address, "--learner", learner.address,
            "--num-envs", "4", "--n-step", "1", *(["--life-loss-terminal"] if ends else []),
        )  # fmt: skip
        processes += [actor, learner, replay]
        clients[ends] = ReplayClient(replay.address)
    wait_for(lambda: min(c.info().size for c in clients.values()) >= 4_000, 240, "4,000 items")
    ended = {}
    for ends, client in clients.items():
        fields, ok = unpack(client.sample(8_000, beta=0.0).columns, columns)
        assert ok.all()
        ended[ends] = (fields["discount"] == 0).mean()
        client.close()
    assert ended[False] > 0  # games did end
    assert ended[True] > 3 * ended[False], ended
    for process in processes:
        process.stop()
