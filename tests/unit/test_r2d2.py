"""R2D2's pure parts on hand values (h and its inverse, the priority mix, n-step targets at
episode ends, burn-in), its policy's state per env, and a learner that must remember a cue."""

import copy

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.adders.sequence import SequenceAdder
from apexrl.algorithms.base import Step
from apexrl.algorithms.columns import pack, unpack
from apexrl.algorithms.envs import MASKED_CARTPOLE, EnvSpec, make_env
from apexrl.algorithms.evaluation import evaluate
from apexrl.algorithms.networks import MLPTorso
from apexrl.algorithms.r2d2.builder import CARTPOLE, sequence_columns
from apexrl.algorithms.r2d2.losses import (
    nstep_returns,
    priority_mix,
    r2d2_loss,
    rescale,
    td_errors,
    unrescale,
    unroll_with_burn_in,
)
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork
from apexrl.common.errors import InvalidArgument
from apexrl.config import LearnerConfig
from apexrl.replay.signature import parse_signature
from apexrl.replay.table import Table


def test_value_rescaling_by_hand_and_round_trip():
    x = torch.tensor([0.0, 3.0, -8.0], dtype=torch.float64)
    np.testing.assert_allclose(rescale(x), [0.0, 1.003, -2.008])  # sqrt(4)-1+.003, -(3-1)-.008
    np.testing.assert_allclose(unrescale(torch.tensor([1.003, -2.008], dtype=torch.float64)),
                               [3.0, -8.0], rtol=1e-9)  # fmt: skip
    values = torch.linspace(-5000, 5000, 10_001, dtype=torch.float64)
    np.testing.assert_allclose(unrescale(rescale(values)), values, rtol=1e-9, atol=1e-9)


def test_priority_mix_of_hand_td_errors():
    td = torch.tensor([[1.0, -3.0, 2.0, 100.0], [0.5, 0.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    # 0.9 * max + 0.1 * mean over the masked steps; a sequence without any gets 0.
    np.testing.assert_allclose(priority_mix(td, mask, 0.9), [0.9 * 3 + 0.1 * 2, 0.5, 0.0])


def test_nstep_targets_bootstrap_at_the_sequence_end_and_stop_at_a_terminal():
    rewards = torch.tensor([[1.0, 2, 3, 4], [1.0, 2, 0, 0], [1.0, 2, 0, 0]])
    discounts = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0, 0, 0], [0.5, 0.5, 0, 0]])
    values = torch.tensor([[0.0, 10, 20, 30, 40], [0.0, 10, 20, 0, 0], [0.0, 10, 20, 0, 0]])
    real = torch.tensor([4, 2, 2])
    out = nstep_returns(rewards, discounts, values, real, n=2)
    # Full: step 3 has one step left, so it bootstraps from values[4].
    np.testing.assert_allclose(out[0], [1 + 0.5 * 2 + 0.25 * 20, 2 + 1.5 + 0.25 * 30,
                                        3 + 2 + 0.25 * 40, 4 + 0.5 * 40])  # fmt: skip
    # Terminal at step 1: its discount 0 cuts the bootstrap from the final observation.
    np.testing.assert_allclose(out[1, :2], [1 + 0.5 * 2, 2])
    # Truncated at step 1 (discount gamma): the final observation's value bootstraps.
    np.testing.assert_allclose(out[2, :2], [1 + 0.5 * 2 + 0.25 * 20, 2 + 0.5 * 20])


def test_td_errors_bootstrap_from_the_target_value_unrescaled_with_discount():
    """y_t = h(sum of discounted rewards + d^m h^-1(Q_target(s_{t+m}, argmax_a Q(s_{t+m}, a))))
    by hand, burn-in 1, n 2, discount 0.5. Q_target holds h(3), h(8), h(15), h(24) (h(x) =
    sqrt(x + 1) - 1 + 0.001 x), and at each next state prefers the action the online net does
    not. Sequence 0 (all real): R_0 = 11 + 0.5 * 0.5 + 0.25 * 15 = 15 and R_1 = 0.5 + 0.5 * 15
    = 8; sequence 1 (one real learned step, then padding): R_0 = 6.5 + 0.5 * 3 = 8."""
    h = {x: (x + 1) ** 0.5 - 1 + 0.001 * x for x in (3, 8, 15, 24)}
    # Rows: the observations of steps 1, 2 and 3 (after burn-in step 0); 2 actions.
    q = torch.tensor([[0.3, 0.7], [0.2, 1.0], [2.0, 0.5]], dtype=torch.float64)
    q_target = torch.tensor([[0.0, 0.0], [h[8], h[3]], [h[15], h[24]]], dtype=torch.float64)
    batch = {
        "actions": torch.tensor([[0, 1, 0], [0, 1, 0]]),
        "rewards": torch.tensor([[100.0, 11.0, 0.5], [100.0, 6.5, 50.0]], dtype=torch.float64),
        "discounts": torch.full((2, 3), 0.5, dtype=torch.float64),
        "mask": torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64),
    }
    td, mask, q_taken = td_errors(q.expand(2, 3, 2), q_target.expand(2, 3, 2), batch, 1, 2)
    np.testing.assert_allclose(q_taken, [[0.7, 0.2], [0.7, 0.2]])
    np.testing.assert_allclose(mask, [[1, 1], [1, 0]])
    np.testing.assert_allclose(td, [[h[15] - 0.7, h[8] - 0.2], [h[8] - 0.7, 0.0]], rtol=1e-9)


def test_nstep_returns_stay_on_their_inputs_device():
    """Step indices made on the CPU would not mix with a GPU batch; the meta device (shapes
    only, no data) shows it without a GPU."""
    rewards = torch.zeros(2, 4, device="meta")
    values = torch.zeros(2, 5, device="meta")
    real = torch.tensor([4, 2], device="meta")
    out = nstep_returns(rewards, rewards, values, real, n=2)
    assert out.device.type == "meta" and out.shape == (2, 4)


class ObservedQ(torch.nn.Module):
    """A recurrent Q-network whose Q-values are its observations: every TD error by hand."""

    def unroll(self, obs, state):
        return obs, state


def test_r2d2_loss_priorities_and_mean_q_by_hand():
    """n 1, no burn-in, discount 0: y = h(r) (h(8) = 2.008, h(3) = 1.003, h(0) = 0), so the
    TD errors are [1, 2, 0.5] and, the last step padding, [1, 3, 0]. Per sequence half their
    squares summed over the 3 places: 0.875 and 5 / 3; weighted by 1 and 0.4, then averaged."""
    q_taken = torch.tensor([[1.008, -2.0, 0.503], [-1.0, -1.997, 5.0]], dtype=torch.float64)
    observations = torch.zeros(2, 4, 2, dtype=torch.float64)
    observations[:, :3, 0] = q_taken
    batch = {
        "observations": observations,
        "state": torch.zeros(2, 1, dtype=torch.float64),
        "actions": torch.zeros(2, 3, dtype=torch.long),
        "rewards": torch.tensor([[8.0, 0.0, 3.0], [0.0, 3.0, 100.0]], dtype=torch.float64),
        "discounts": torch.zeros(2, 3, dtype=torch.float64),
        "mask": torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64),
    }
    weights = torch.tensor([1.0, 0.4], dtype=torch.float64)
    net = ObservedQ()
    loss, priorities, q_mean = r2d2_loss(net, net, batch, weights, burn_in=0, n=1, eta=0.9)
    np.testing.assert_allclose(loss, (0.875 + 0.4 * 5 / 3) / 2, rtol=1e-9)
    np.testing.assert_allclose(priorities, [0.9 * 2 + 0.1 * 3.5 / 3, 0.9 * 3 + 0.1 * 2])
    # The mean of Q(s, a) over the 5 learned real steps; the padded step's is not read.
    np.testing.assert_allclose(q_mean, (1.008 - 2.0 + 0.503 - 1.0 - 1.997) / 5, rtol=1e-9)
    # One learned real step in the whole batch: its Q(s, a) is the mean.
    batch["mask"] = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    _, _, q_mean = r2d2_loss(net, net, batch, weights, burn_in=0, n=1, eta=0.9)
    np.testing.assert_allclose(q_mean, 1.008, rtol=1e-9)


def test_what_burn_in_steps_hold_changes_nothing_the_learner_does(one_thread):
    """The burn-in steps only warm up the state: changing their rewards, actions and discounts
    leaves the priorities and the networks after an update exactly as they were."""
    settings = algorithms.get("r2d2").Settings(
        sequence_length=6,
        sequence_period=3,
        burn_in=2,
        n_step=3,
        lstm_size=8,
        target_update_interval=1,
    )
    config = LearnerConfig(algorithm="r2d2", env=MASKED_CARTPOLE, hidden="16", algo=settings)
    torch.manual_seed(0)
    learning = algorithms.make(config).learning(config, torch.device("cpu"))
    other = copy.deepcopy(learning)
    batch, _ = cue_batch(np.random.default_rng(4))
    batch["discounts"][:] = 0.9
    changed = {k: v.clone() for k, v in batch.items()}
    changed["rewards"][:, :2] += 100.0
    changed["actions"][:, :2] = 1 - changed["actions"][:, :2]
    changed["discounts"][:, :2] = 0.0
    priorities, _ = learning.update(batch, torch.ones(64), 1)
    again, _ = other.update(changed, torch.ones(64), 1)
    torch.testing.assert_close(again, priorities, rtol=0, atol=0)
    for name, value in learning.online.state_dict().items():
        torch.testing.assert_close(other.online.state_dict()[name], value, rtol=0, atol=0)


def network(obs_dim=2, actions=2, lstm=8):
    torch.manual_seed(0)
    return RecurrentQNetwork(MLPTorso(obs_dim, (8,)), actions, lstm)


def test_burn_in_hands_over_the_unrolled_state_and_passes_no_gradient():
    net = network()
    obs = torch.randn(3, 7, 2, requires_grad=True)
    state = torch.randn(3, net.state_size)
    q = unroll_with_burn_in(net, obs, state, burn_in=3)
    with torch.no_grad():
        _, warmed = net.unroll(obs[:, :3], state)
        expected, _ = net.unroll(obs[:, 3:], warmed)
    torch.testing.assert_close(q, expected)
    q.sum().backward()
    assert (obs.grad[:, :3] == 0).all() and (obs.grad[:, 3:] != 0).any()


def test_the_policy_keeps_a_state_per_env_and_restarts_it_with_an_episode():
    config = LearnerConfig(algorithm="r2d2", env=MASKED_CARTPOLE, hidden="8",
                           algo=algorithms.get("r2d2").Settings(lstm_size=4))  # fmt: skip
    policy = algorithms.make(config).policy()
    rng = np.random.default_rng(0)
    obs = np.ones((3, 2), np.float32)
    policy.episode_starts(np.ones(3, bool))
    _, first = policy.step(obs, 0.0, rng)
    np.testing.assert_array_equal(first["state"], 0)
    _, second = policy.step(obs, 0.0, rng)
    assert (second["state"] != 0).any(axis=1).all()  # carried from the first step
    policy.episode_starts(np.array([False, True, False]))
    _, third = policy.step(obs, 0.0, rng)
    np.testing.assert_array_equal(third["state"][1], 0)
    assert (third["state"][[0, 2]] != 0).any(axis=1).all()
    policy.keep_envs(np.array([2]))
    _, fourth = policy.step(obs[:1], 0.0, rng)
    assert fourth["state"].shape == (1, 8)
    np.testing.assert_array_equal(fourth["exploration"], [0.0])
    returns = evaluate(policy, MASKED_CARTPOLE, 3, seed=5)  # episodes that end apart
    assert len(returns) == 3 and (returns >= 1).all()


def test_the_masked_cartpole_shows_position_and_angle_only():
    full, masked = make_env("CartPole-v1"), make_env(MASKED_CARTPOLE)
    seen, _ = masked.reset(seed=3)
    everything, _ = full.reset(seed=3)
    np.testing.assert_array_equal(seen, everything[[0, 2]])
    assert masked.observation_space.shape == (2,)
    step_seen = masked.step(1)[0]
    np.testing.assert_array_equal(step_seen, full.step(1)[0][[0, 2]])


def cue_batch(rng, batch=64, length=6, burn_in=2):
    """Sequences whose reward, at every step, is 1 for the action matching a cue shown only at
    the first step (inside the burn-in) and 0 otherwise; discounts 0 (each step is a bandit).
    Half the sequences end after 4 real steps, their padding carrying rewards of 50."""
    cue = rng.integers(2, size=batch)
    obs = np.zeros((batch, length + 1, 2), np.float32)
    obs[:, :, 1] = 1.0
    obs[:, 0, 0] = np.where(cue == 1, 1.0, -1.0)
    actions = rng.integers(2, size=(batch, length))
    rewards = (actions == cue[:, None]).astype(np.float32)
    mask = np.ones((batch, length), np.float32)
    short = np.arange(batch) % 2 == 0
    mask[short, 4:], rewards[short, 4:] = 0.0, 50.0
    columns = {"observations": obs, "actions": actions, "rewards": rewards,
               "discounts": np.zeros((batch, length), np.float32), "mask": mask,
               "state": np.zeros((batch, 16), np.float32)}  # fmt: skip
    return {k: torch.from_numpy(v) for k, v in columns.items()}, cue


@pytest.fixture
def one_thread():
    """Tensors this small gain nothing from threads, which on a busy machine wait on each other
    (20 ms an update on one thread, 500 ms on two under a load of 17)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_learner_learns_what_the_burned_in_state_remembers(one_thread):
    """Fails when the loss's sign flips, when the burn-in hands over no state (the cue is then
    unknown), or when padding is learned from (its rewards of 50 pull every Q-value up)."""
    settings = algorithms.get("r2d2").Settings(
        sequence_length=6,
        sequence_period=3,
        burn_in=2,
        n_step=1,
        lstm_size=8,
        target_update_interval=1,
    )
    config = LearnerConfig(algorithm="r2d2", env=MASKED_CARTPOLE, hidden="16", algo=settings,
                           learning_rate=1e-2)  # fmt: skip
    torch.manual_seed(0)
    learning = algorithms.make(config).learning(config, torch.device("cpu"))
    rng = np.random.default_rng(0)
    for step in range(1, 301):
        batch, _ = cue_batch(rng)
        priorities, figures = learning.update(batch, torch.ones(64), step)
    assert priorities.shape == (64,) and np.isfinite(figures["loss"])
    batch, cue = cue_batch(rng)
    with torch.no_grad():
        q = unroll_with_burn_in(learning.online, batch["observations"], batch["state"], 2)[:, :4]
    matching = q.gather(2, torch.from_numpy(cue).view(-1, 1, 1).expand(-1, 4, 1)).squeeze(2)
    other = q.gather(2, torch.from_numpy(1 - cue).view(-1, 1, 1).expand(-1, 4, 1)).squeeze(2)
    np.testing.assert_allclose(matching.mean(), rescale(torch.tensor(1.0)), atol=0.1)
    np.testing.assert_allclose(other.mean(), 0.0, atol=0.1)
    assert (matching > other).float().mean() > 0.95


def test_the_actors_priorities_from_the_values_it_acted_on_are_the_learners(one_thread):
    """Ape-X's actors prioritise with the Q-values they acted on; with the same parameters
    throughout, the learner's unroll from each stored state (burn-in included) finds the same
    values, so the same priorities, at episode ends and truncations as much as mid-episode."""
    settings = algorithms.get("r2d2").Settings(
        sequence_length=8, sequence_period=4, burn_in=2, n_step=3, lstm_size=8
    )
    config = LearnerConfig(algorithm="r2d2", env=MASKED_CARTPOLE, hidden="16", algo=settings)
    torch.manual_seed(0)
    policy = algorithms.make(config).policy()
    adder = SequenceAdder(3, 8, 4, (2,), np.float32, policy.net.state_size, 0.9)
    rng = np.random.default_rng(0)
    obs, items = rng.normal(size=(3, 2)).astype(np.float32), []
    policy.episode_starts(np.ones(3, bool))
    for _ in range(200):
        actions, extras = policy.step(obs, 0.3, rng)
        ends, truncated = rng.random(3) < 0.04, rng.random(3) < 0.03
        truncated &= ~ends
        next_obs = rng.normal(size=(3, 2)).astype(np.float32)
        final = np.where((ends | truncated)[:, None], rng.normal(size=(3, 2)), next_obs)
        step = Step(obs, actions, extras, rng.normal(size=3).astype(np.float32), ends,
                    truncated, next_obs, final.astype(np.float32), 0)  # fmt: skip
        if (out := adder.add(step)) is not None:
            items.append(out)
        policy.episode_starts(ends | truncated)
        obs = next_obs
    batch = {k: np.concatenate([item[k] for item in items]) for k in items[0]}
    short = batch["mask"].sum(1) < 8
    assert len(batch["mask"]) > 100 and short.sum() > 10  # tails after ends and truncations
    stored = {k: torch.from_numpy(v) for k, v in batch.items() if k not in adder.acting_fields}
    with torch.no_grad():
        _, expected, _ = r2d2_loss(policy.net, policy.net, stored, torch.ones(len(short)),
                                   2, 3, settings.priority_eta)  # fmt: skip
    np.testing.assert_allclose(policy.priorities(batch), expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("settings", "setting"),
    [({"burn_in": 80}, "burn_in"), ({"sequence_period": 81}, "sequence_period"),
     ({"n_step": 0}, "n_step"), ({"priority_eta": 1.5}, "priority_eta")],
)  # fmt: skip
def test_the_builder_refuses_bad_settings_naming_them(settings, setting):
    config = LearnerConfig(algorithm="r2d2", env="CartPole-v1",
                           algo=algorithms.get("r2d2").Settings(**settings))  # fmt: skip
    with pytest.raises(ValueError, match=f"^{setting}: "):
        algorithms.make(config)


def test_stacked_frames_travel_once_per_step_and_come_back_as_the_adder_made_them():
    """Frame stacks as FrameStackObservation gives them (a new episode's first stack is its first
    frame 4 times), through the sequence adder, pack (the actor) and unpack (the learner)."""
    spec = EnvSpec("ALE/Test-v5", (4, 8, 8), np.dtype(np.uint8), 3, (), None, None, True)
    columns = sequence_columns(spec, length=6, state_size=2)
    assert [c.name for c in columns[:2]] == ["observations", "observations_starts"]
    assert columns[0].shape == (6 + 1 + 3, 8, 8) and columns[0].codec == "zstd"
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (12, 8, 8), dtype=np.uint8)

    def stack(t):  # the stack after frame t of an episode that began at frame 0
        return frames[np.maximum(np.arange(t - 3, t + 1), 0)]

    adder = SequenceAdder(1, 6, 3, spec.obs_shape, np.uint8, state_size=2, gamma=0.9)
    items = []
    for t in range(8):  # an 8-step episode: steps 0-5 at step 6, then 3-7 at its end
        end = np.array([t == 7])
        step = Step(stack(t)[None], np.zeros(1, np.int64),
                    {"state": np.zeros((1, 2), np.float32), "exploration": np.zeros(1, np.float32)},
                    np.zeros(1, np.float32), end, np.zeros(1, bool), stack(t + 1)[None],
                    stack(t + 1)[None], 0)  # fmt: skip
        out = adder.add(step)
        if out is not None:
            items.append(out)
    batch = {k: np.concatenate([item[k] for item in items]) for k in items[0]}
    assert len(batch["mask"]) == 2 and batch["mask"][1].tolist() == [1, 1, 1, 1, 1, 0]
    packed = pack(batch, columns)
    assert packed["observations"].item_nbytes == 10 * 8 * 8  # 10 frames, not 7 stacks of 4
    unpacked, ok = unpack(packed, columns)
    assert ok.all()
    np.testing.assert_array_equal(unpacked["observations"], batch["observations"])


@pytest.mark.parametrize(
    ("column", "shape", "dtype"),
    [("actions", (2, 19), np.int64), ("observations", (2, 20, 2), np.float32),
     ("state", (2, 64), np.float32)],
)  # fmt: skip
def test_the_replay_refuses_a_sequence_of_another_length_or_state_naming_the_column(
    column, shape, dtype
):
    """The table r2d2 declares (the presets' 20 steps, a state of 2 x 64) against inserts whose
    columns disagree with it: refused naming the column, nothing stored."""
    config = LearnerConfig(algorithm="r2d2", env=MASKED_CARTPOLE,
                           algo=algorithms.get("r2d2").Settings(**CARTPOLE["r2d2"]))  # fmt: skip
    (declared,) = algorithms.make(config).tables()
    table = Table("default", 8, signature=parse_signature(declared.signature))
    good = {c.name: np.zeros((2, *c.shape), c.dtype) for c in algorithms.make(config).columns()}
    table.insert(good, np.ones(2))
    digest = table.digest()
    with pytest.raises(InvalidArgument) as refused:
        table.insert({**good, column: np.zeros(shape, dtype)}, np.ones(2))
    assert refused.value.field == f'batch.columns["{column}"]'
    assert table.digest() == digest
