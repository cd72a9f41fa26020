"""UNREAL's auxiliary tasks: the pseudo-rewards, targets and losses by hand, a learner that
learns each task, each task's switch, the experience adders, and the settings it refuses."""

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.base import Step
from apexrl.algorithms.unreal.adders import RewardWindowAdder
from apexrl.algorithms.unreal.builder import Settings
from apexrl.algorithms.unreal.learning import UNREALLearning
from apexrl.algorithms.unreal.losses import (
    nstep_returns,
    pixel_change,
    pixel_control_loss,
    reward_classes,
    value_replay_loss,
)
from apexrl.algorithms.unreal.networks import UNREALNetwork
from apexrl.config import LearnerConfig

IMAGE = (4, 84, 84)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small networks on a shared machine: more threads only wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_pixel_change_is_the_mean_absolute_change_of_each_4x4_cell_of_the_centre():
    before = np.zeros((84, 84), np.uint8)
    after = before.copy()
    after[2:6, 2:6] = 255  # the whole first cell of the 80x80 centre
    after[6, 10] = 51  # one pixel of cell (1, 2): centre row 4, column 8
    after[0, :] = after[:, 83] = 255  # outside the centre: no cell sees them
    before[40, 41] = 100  # centre (38, 39): cell (9, 9), falls to 0
    change = pixel_change(torch.from_numpy(before), torch.from_numpy(after)).numpy()
    expected = np.zeros((20, 20))
    expected[0, 0] = 1.0
    expected[1, 2] = 51 / 255 / 16
    expected[9, 9] = 100 / 255 / 16
    np.testing.assert_allclose(change, expected, rtol=1e-6)


def test_nstep_returns_cut_at_episode_ends():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    bootstrap = torch.tensor([10.0])
    np.testing.assert_allclose(
        nstep_returns(rewards, torch.full((3, 1), 0.5), bootstrap).numpy()[:, 0],
        [1 + 0.5 * (2 + 0.5 * (3 + 0.5 * 10)), 2 + 0.5 * (3 + 0.5 * 10), 3 + 0.5 * 10],
    )
    ended = torch.tensor([[0.5], [0.0], [0.5]])  # the episode ended at step 1
    np.testing.assert_allclose(
        nstep_returns(rewards, ended, bootstrap).numpy()[:, 0], [2.0, 2.0, 8.0]
    )


@pytest.mark.parametrize("discount,expected", [(0.99, (2.62**2 + 1.8**2) / 2), (0.0, 0.5)])
def test_pixel_control_targets_are_nstep_q_with_gamma_0_9(discount, expected):
    """Frames 0 -> 1 change cell (0, 0) entirely, 1 -> 2 nothing; max_a Q(x_2) is 2 at that
    cell, 0 elsewhere; Q(x_t, a_t) is 0. R_1 = 0 + 0.9 * 2 = 1.8, R_0 = 1 + 0.9 * 1.8 = 2.62
    (other cells: 0); with discount 0 at step 1 (the episode ended), R_1 = 0 and R_0 = 1."""
    frames = torch.zeros(3, 1, 84, 84, dtype=torch.uint8)
    frames[1:, 0, 2:6, 2:6] = 255
    q = torch.zeros(3, 1, 2, 20, 20)
    q[2, 0, 1, 0, 0] = 2.0
    q[:2, 0, 1] = 7.0  # the action not taken: never read
    actions = torch.zeros(2, 1, dtype=torch.int64)
    discounts = torch.tensor([[0.99], [discount]])
    loss = pixel_control_loss(q, actions, frames, discounts, 0.9)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_pixel_control_reads_the_q_map_of_the_action_taken():
    """Action 1 taken at both steps, its map 7 at every cell, action 0's 0; nothing changes on
    screen and the bootstrap is 0: each step's error is 7^2 at each of the 400 cells."""
    q = torch.zeros(3, 1, 2, 20, 20)
    q[:2, 0, 1] = 7.0
    frames = torch.zeros(3, 1, 84, 84, dtype=torch.uint8)
    actions = torch.ones(2, 1, dtype=torch.int64)
    loss = pixel_control_loss(q, actions, frames, torch.full((2, 1), 0.99), 0.9)
    assert loss.item() == pytest.approx(49 * 400)


def test_value_replay_regresses_to_nstep_returns_from_the_last_value():
    values = torch.tensor([[0.5], [0.2], [4.0]])
    rewards, discounts = torch.tensor([[1.0], [2.0]]), torch.full((2, 1), 0.9)
    # R_1 = 2 + 0.9 * 4 = 5.6, R_0 = 1 + 0.9 * 5.6 = 6.04
    expected = 0.5 * ((6.04 - 0.5) ** 2 + (5.6 - 0.2) ** 2) / 2
    assert value_replay_loss(values, rewards, discounts).item() == pytest.approx(expected)


def test_reward_classes_are_zero_positive_negative_around_the_threshold():
    rewards = torch.tensor([0.0, 0.1, 0.11, -0.1, -0.5, 1.0])
    assert reward_classes(rewards, 0.1).tolist() == [0, 0, 1, 0, 2, 1]


def test_reward_windows_are_three_steps_of_one_episode_marked_by_their_reward():
    adder = RewardWindowAdder(1, (1,), np.float32, threshold=0.1, table="rewards")
    ends = [False, False, False, True, False, False, False]
    rewards = [0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.0625]  # the last: below the threshold
    windows = []
    for t, (end, reward) in enumerate(zip(ends, rewards, strict=True)):
        obs = np.array([[float(t)]], np.float32)
        step = Step(obs, np.zeros(1), {}, np.array([reward], np.float32), np.array([end]),
                    np.array([False]), obs + 1, obs + 1, 1)  # fmt: skip
        items = adder.add(step)
        if items is not None:
            windows.append((items["observations"][0, :, 0].tolist(), float(items["reward"][0])))
            marks = adder.priorities(items, policy=None)
            assert marks.tolist() == [float(abs(reward) > 0.1)]
    # steps 0-3 are an episode, 4-6 the next: no window spans the reset
    assert windows == [([0, 1, 2], 1.0), ([1, 2, 3], -1.0), ([4, 5, 6], 0.0625)]


def settings(**overrides) -> Settings:
    base = dict(unroll_length=2, sequence_length=3, replay_batch=4, entropy_cost=0.0)
    return Settings(**(base | overrides))


def learning(image: bool, lr: float = 3e-3, **overrides) -> UNREALLearning:
    s = settings(**overrides)
    shape, dtype = (IMAGE, np.uint8) if image else ((4,), np.float32)

    def build():
        return UNREALNetwork(shape, dtype, 2, (32,), pixel_control=s.pc_lambda > 0,
                             reward_prediction=s.rp_lambda > 0)  # fmt: skip

    torch.manual_seed(0)
    config = LearnerConfig(algorithm="unreal", learning_rate=lr, max_grad_norm=10.0)
    return UNREALLearning(build, config, s, torch.device("cpu"))


def unrolls(shape, dtype, b: int = 2, t: int = 2) -> dict[str, torch.Tensor]:
    """A batch of quiet unrolls (zero observations and rewards) for the base loss."""
    return {
        "observations": torch.zeros((b, t + 1, *shape), dtype=dtype),
        "actions": torch.zeros((b, t), dtype=torch.int64),
        "rewards": torch.zeros(b, t),
        "discounts": torch.full((b, t), 0.99),
        "log_probs": torch.full((b, t), float(np.log(0.5))),
        "version": torch.ones(b, dtype=torch.int64),
    }


def reward_windows(rng, n: int) -> dict[str, torch.Tensor]:
    """Windows whose last observation's first entry says the reward's sign."""
    obs = rng.standard_normal((n, 3, 4)).astype(np.float32)
    sign = np.sign(obs[:, 2, 0]) * (np.abs(obs[:, 2, 0]) > 0.5)
    return {"rewards/observations": torch.from_numpy(obs),
            "rewards/reward": torch.from_numpy(sign.astype(np.float32))}  # fmt: skip


def sequences(rng, n: int) -> dict[str, torch.Tensor]:
    """Sequences of 3 steps staying in one state of level c with rewards c and discount 0.5:
    V = c + 0.5 V, so V = 2c."""
    levels = rng.choice([-1.0, 0.5, 1.0], n).astype(np.float32)
    obs = torch.zeros((n, 4, 4))
    obs[:, :, 0] = torch.from_numpy(levels)[:, None]
    return {
        "experience/observations": obs,
        "experience/actions": torch.zeros((n, 3), dtype=torch.int64),
        "experience/rewards": torch.from_numpy(levels)[:, None].repeat(1, 3),
        "experience/discounts": torch.full((n, 3), 0.5),
        "experience/levels": torch.from_numpy(levels),
    }


def test_reward_prediction_learns_the_sign_of_the_next_reward():
    learner = learning(image=False, pc_lambda=0.0, vr_lambda=0.0)
    rng = np.random.default_rng(0)
    for step in range(100):
        learner.update(unrolls((4,), torch.float32) | reward_windows(rng, 64), None, step + 1)
    test = reward_windows(rng, 1000)
    with torch.no_grad():
        predicted = learner.net.reward_logits(test["rewards/observations"]).argmax(1).numpy()
    reward = test["rewards/reward"].numpy()
    expected = np.select([reward > 0, reward < 0], [1, 2], 0)  # zero, positive, negative
    assert (predicted == expected).mean() > 0.9


@pytest.mark.parametrize("pc_gamma", [0.5, 0.9])
def test_the_learner_discounts_pixel_control_by_pc_gamma(pc_gamma):
    """Pixel control's head zeroed to Q = 1 everywhere; frames 0 -> 1 change cell (0, 0)
    entirely, 1 -> 2 nothing; the episode goes on. With g = pc_gamma, R_1 = g and R_0 = 1 + g^2
    at that cell, g and g^2 at the 399 others: the learner's loss is the mean over the 2 steps
    of the squared errors to Q = 1 summed over the cells, and its weighted share pc_lambda."""
    learner = learning(image=True, pc_gamma=pc_gamma, rp_lambda=0.0, vr_lambda=0.0)
    head = learner.net.pixel_control
    with torch.no_grad():
        for conv in (head.value, head.advantage):
            conv.weight.zero_()
            conv.bias.zero_()
        head.value.bias.fill_(1.0)
    obs = torch.zeros((1, 3, *IMAGE), dtype=torch.uint8)
    obs[:, 1:, -1, 2:6, 2:6] = 255
    batch = {
        "experience/observations": obs,
        "experience/actions": torch.tensor([[0, 1]]),
        "experience/rewards": torch.zeros(1, 2),
        "experience/discounts": torch.full((1, 2), 0.99),
    }
    g = pc_gamma
    want = ((1 + g**2 - 1) ** 2 + 399 * (g**2 - 1) ** 2 + 400 * (g - 1) ** 2) / 2
    assert learner.auxiliary_losses(batch)["pc"].item() == pytest.approx(want, rel=1e-5)
    total, _ = learner.auxiliary(batch)
    assert total.item() == pytest.approx(learner.settings.pc_lambda * want, rel=1e-5)


def test_value_replay_learns_the_values_of_the_replayed_states():
    learner = learning(image=False, pc_lambda=0.0, rp_lambda=0.0)
    rng = np.random.default_rng(1)
    for step in range(300):
        learner.update(unrolls((4,), torch.float32) | sequences(rng, 16), None, step + 1)
    test = sequences(rng, 30)
    with torch.no_grad():
        values = learner.net.values(test["experience/observations"][:, 0])
    np.testing.assert_allclose(values.numpy(), 2 * test["experience/levels"].numpy(), atol=0.2)


@pytest.mark.slow  # 40 updates of two Nature CNNs: ~13 s on 2 busy cores
def test_pixel_control_learns_which_action_changes_which_cell():
    """From a blank screen, action 1 lights cell (0, 0) of the next frame and action 0 does
    nothing; the episode ends there. Q(blank, 1) at that cell goes to 1, Q(blank, 0) to 0."""
    learner = learning(image=True, lr=1e-2, rp_lambda=0.0, vr_lambda=0.0, sequence_length=1)
    rng = np.random.default_rng(2)
    for step in range(40):
        actions = torch.from_numpy(rng.integers(0, 2, (8, 1)))
        obs = torch.zeros((8, 2, *IMAGE), dtype=torch.uint8)
        obs[:, 1, -1, 2:6, 2:6] = 255 * actions[:, :1, None]
        replayed = {
            "experience/observations": obs,
            "experience/actions": actions,
            "experience/rewards": torch.zeros(8, 1),
            "experience/discounts": torch.zeros(8, 1),
        }
        learner.update(unrolls(IMAGE, torch.uint8, b=1, t=1) | replayed, None, step + 1)
    with torch.no_grad():
        q = learner.net.pixel_q(torch.zeros((1, *IMAGE), dtype=torch.uint8))[0, :, 0, 0]
    assert q[1] > 0.7 and q[0] < 0.3, q


@pytest.mark.parametrize("task,head", [("pc", "pixel_control."), ("rp", "reward_prediction."),
                                       ("vr", "value")])  # fmt: skip
def test_switching_a_task_off_takes_exactly_its_own_gradients_away(task, head):
    """The auxiliary gradient with every task on, less the one with `task` off, is `task`'s
    own weighted gradient; `task`'s own head gets none when it is off."""
    learner = learning(image=True)
    rng = np.random.default_rng(3)
    frames = torch.from_numpy(rng.integers(0, 256, (2, 4, *IMAGE), dtype=np.uint8))
    batch = {
        "experience/observations": frames,
        "experience/actions": torch.tensor([[0, 1, 1], [1, 0, 1]]),
        "experience/rewards": torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.5]]),
        "experience/discounts": torch.tensor([[0.99, 0.0, 0.99], [0.99, 0.99, 0.99]]),
        "rewards/observations": frames[:, :3],
        "rewards/reward": torch.tensor([1.0, 0.0]),
    }

    def gradients(weights: dict[str, float]) -> dict[str, torch.Tensor]:
        for name, weight in weights.items():
            setattr(learner.settings, f"{name}_lambda", weight)
        learner.net.zero_grad()
        total, _ = learner.auxiliary(batch)
        total.backward()
        return {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                for n, p in learner.net.named_parameters()}  # fmt: skip

    on = {"pc": 0.05, "rp": 1.0, "vr": 1.0}
    every = gradients(on)
    without = gradients(on | {task: 0.0})
    alone = gradients({name: on[name] if name == task else 0.0 for name in on})
    for name, grad in every.items():
        torch.testing.assert_close(grad - without[name], alone[name], atol=1e-6, rtol=1e-4)
        if name.startswith(head):
            assert not without[name].any(), name
    assert any(alone[name].any() for name in alone if name.startswith(head))


def test_every_head_leaves_a_bfloat16_autocast_as_float32():
    """precision bfloat16 runs the passes under autocast; V-trace, GAE and the auxiliary targets
    are computed from these outputs, and would lose all but 8 bits in bfloat16."""
    net = UNREALNetwork(IMAGE, np.uint8, 3, (32,), pixel_control=True, reward_prediction=True)
    obs = torch.randint(0, 256, (2, *IMAGE), dtype=torch.uint8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, values = net(obs)
        outputs = [logits, values, net.policy(obs), net.values(obs), net.pixel_q(obs),
                   net.reward_logits(torch.stack([obs, obs, obs], 1))]  # fmt: skip
    assert net.logits.weight.dtype == torch.float32
    assert [o.dtype for o in outputs] == [torch.float32] * 6


def test_bad_settings_are_refused_naming_them():
    def make(env="CartPole-v1", **overrides):
        overrides.setdefault("pc_lambda", 0.0)
        algorithms.make(LearnerConfig(algorithm="unreal", env=env, algo=Settings(**overrides)))

    make()  # CartPole without pixel control: fine
    for name in ("rp_lambda", "pc_lambda", "vr_lambda", "reward_threshold"):
        with pytest.raises(ValueError, match=f"^{name}: must be >= 0, got -0.5"):
            make(**{name: -0.5})
    with pytest.raises(ValueError, match="^experience_steps: 19 holds less than one sequence"):
        make(experience_steps=19, sequence_length=20)
    with pytest.raises(ValueError, match="^pc_lambda: pixel control needs image observations"):
        make(pc_lambda=0.05)


def test_pong_experience_fills_each_table_and_comes_back_exact():
    """The adders of unreal on Pong (pixel control on) fed by a real vector env: each table's
    items, packed as the actor packs them (frames once per step, compressed), fit the table's
    signature and come back from the replay as they went in."""
    pytest.importorskip("ale_py")
    from apexrl.algorithms.columns import pack, unpack
    from apexrl.algorithms.envs import make_vector_env
    from apexrl.replay.signature import parse_signature
    from apexrl.replay.table import Table

    config = LearnerConfig(
        algorithm="unreal", env="ALE/Pong-v5", algo=Settings(unroll_length=4, sequence_length=3)
    )
    builder = algorithms.make(config)
    policy = builder.policy()
    adders = builder.adders(2, policy)
    assert [a.table for a in adders] == ["default", "experience", "rewards"]
    envs, obs = make_vector_env("ALE/Pong-v5", 2, seed=3)
    rng = np.random.default_rng(0)
    made: dict[str, list] = {a.table: [] for a in adders}
    for _ in range(6):
        actions, extras = policy.step(obs, 1.0, rng)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        step = Step(obs, actions, extras, rewards.astype(np.float32), terminated, truncated,
                    next_obs, next_obs, 1)  # fmt: skip
        for adder in adders:
            if (items := adder.add(step)) is not None:
                made[adder.table].append(items)
        obs = next_obs
    envs.close()
    signatures = {t.name: t.signature for t in builder.tables()}
    for adder in adders:
        columns = builder.table_columns(adder.table)
        items = {k: np.concatenate([i[k] for i in made[adder.table]]) for k in made[adder.table][0]}
        signature = parse_signature(signatures[adder.table])
        table = Table(adder.table, 64, sampler="uniform", signature=signature, seed=0)
        table.insert(pack(items, columns), adder.priorities(items, policy).astype(np.float64))
        n = len(items["observations"])
        sampled = table.sample(n, 0.0)
        out, ok = unpack(sampled.columns, columns)
        assert ok.all()
        for name, value in items.items():
            np.testing.assert_array_equal(out[name], value[sampled.keys], err_msg=name)
