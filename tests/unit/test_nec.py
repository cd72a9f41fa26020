"""Neural Episodic Control: the DND's lookup against brute-force kNN, its writes (append,
in-place update on an exact match, replacement at capacity), N-step targets at episode ends,
training end to end, the published parameters, bad settings."""

import json

import numpy as np
import pytest
import torch

from apexrl import algorithms
from apexrl.algorithms.nec.builder import Settings
from apexrl.algorithms.nec.dnd import DND
from apexrl.config import LearnerConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def filled(capacity=300, size=200, dim=8, neighbours=50, seed=0) -> tuple[DND, np.ndarray]:
    rng = np.random.default_rng(seed)
    dnd = DND(capacity, dim, neighbours=neighbours)
    keys = rng.standard_normal((size, dim)).astype(np.float32)
    values = rng.standard_normal(size).astype(np.float32)
    dnd.write(keys, values)
    return dnd, values


def test_lookup_matches_brute_force_knn():
    dnd, values = filled()
    keys = dnd.keys.weight.detach().numpy()[:200]
    queries = np.random.default_rng(1).standard_normal((10, 8)).astype(np.float32)
    distances = ((queries[:, None, :] - keys[None]) ** 2).sum(2)
    want = np.argsort(distances, axis=1)[:, :50]
    got = dnd.search(torch.from_numpy(queries))
    np.testing.assert_array_equal(np.sort(got, 1), np.sort(want, 1))
    near = np.take_along_axis(distances, want, 1)
    weights = 1 / (near + 1e-3)
    weights /= weights.sum(1, keepdims=True)
    q = (weights * values[want]).sum(1)
    np.testing.assert_allclose(dnd(torch.from_numpy(queries)).detach().numpy(), q, rtol=1e-4)


def test_lookup_with_fewer_keys_than_k_and_when_empty():
    dnd = DND(100, 4, neighbours=50)
    assert dnd(torch.ones(2, 4)).tolist() == [0.0, 0.0]
    dnd.write(np.eye(4, dtype=np.float32)[:2], np.array([1.0, 3.0], np.float32))
    assert dnd.search(torch.zeros(1, 4)).shape == (1, 2)
    # Equidistant from both keys: the mean of their values.
    assert dnd(torch.zeros(1, 4)).item() == pytest.approx(2.0)


def test_write_appends_then_updates_an_exact_match_in_place():
    dnd = DND(10, 2, neighbours=1, alpha=0.1)
    keys = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    assert dnd.write(keys, np.array([1.0, 2.0], np.float32)) == {
        "updated": 0, "appended": 2, "replaced": 0}  # fmt: skip
    assert dnd.used == 2
    # Key 0 again: its value moves 10% of the way to 11; a near key is appended.
    near = np.array([[1.0, 1e-6]], np.float32)
    counts = dnd.write(np.concatenate([keys[:1], near]), np.array([11.0, 5.0], np.float32))
    assert counts == {"updated": 1, "appended": 1, "replaced": 0}
    values = dnd.values.weight.detach().numpy()[:, 0]
    np.testing.assert_allclose(values[:3], [1.0 + 0.1 * 10.0, 2.0, 5.0])
    # The same new key twice in one batch: appended, then updated in place.
    twice = np.array([[3.0, 3.0], [3.0, 3.0]], np.float32)
    assert dnd.write(twice, np.array([10.0, 20.0], np.float32))["appended"] == 1
    assert dnd.used == 4
    assert dnd.values.weight[3, 0].item() == pytest.approx(10.0 + 0.1 * 10.0)


def test_write_at_capacity_replaces_the_least_recently_used():
    dnd = DND(3, 1, neighbours=1)
    dnd.write(np.array([[0.0], [10.0], [20.0]], np.float32), np.array([0.0, 1.0, 2.0], np.float32))
    # Lookups use keys 0 and 20 (slots 0 and 2): slot 1 (key 10) is the least recently used.
    dnd.search(torch.tensor([[1.0], [19.0]]))
    assert dnd.write(np.array([[30.0]], np.float32), np.array([3.0], np.float32))["replaced"] == 1
    assert dnd.keys.weight[:, 0].tolist() == [0.0, 30.0, 20.0]
    assert dnd.values.weight[:, 0].tolist() == [0.0, 3.0, 2.0]
    assert dnd.used == 3
    # The replaced key is gone: writing it again takes a slot of its own (slot 0, now oldest).
    assert dnd.write(np.array([[10.0]], np.float32), np.array([9.0], np.float32))["replaced"] == 1
    assert sorted(dnd.keys.weight[:, 0].tolist()) == [10.0, 20.0, 30.0]


@pytest.mark.parametrize(
    "options, name",
    [({"capacity": 0}, "capacity"), ({"capacity": 10, "neighbours": 11}, "neighbours")],
)
def test_bad_dictionary_sizes_refused_naming_the_setting(options, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        DND(key_size=4, **{"neighbours": 1, **options})
    # The builder's setting is dnd_capacity (its `capacity` is the replay table's).
    settings = {("dnd_capacity" if k == "capacity" else k): v for k, v in options.items()}
    with pytest.raises(ValueError, match=f"^{'dnd_' * (name == 'capacity')}{name}: "):
        make(**settings)


def test_a_refresh_of_no_versions_is_refused_naming_it():
    with pytest.raises(ValueError, match="^refresh_versions: must be >= 1, got 0"):
        make(refresh_versions=0)


def make(**settings):
    config = LearnerConfig(
        algorithm="nec", env="CartPole-v1", hidden="16", learning_rate=1e-2,
        algo=Settings(**{"dnd_capacity": 50, "neighbours": 5, "key_size": 4, **settings}),
    )  # fmt: skip
    return algorithms.make(config)


def test_the_dictionary_settings_reach_every_dnd_the_builder_makes():
    """delta 0.5, neighbours 2, alpha 0.25, capacity 3, in the learner's, the actors' and a
    plain network's DNDs alike: keys e0, e1 (values 1, 3) and a far one at 10 e2 (value 100).
    A lookup at e0 weighs its 2 nearest by 1/(d + delta) = 1/0.5, 1/2.5: Q = (2 + 1.2) / 2.4; a
    write of 5 to e0 moves its value a quarter of the way, to 2; a fourth key replaces one."""
    builder = make(delta=0.5, neighbours=2, alpha=0.25, dnd_capacity=3)
    learning = builder.learning(builder.config, torch.device("cpu"))
    nets = {"network": builder.network(), "policy": builder.policy().net, "learner": learning.net}
    e = np.eye(4, dtype=np.float32)
    for made_by, net in nets.items():
        for dnd in net.dnds:
            dnd.write(np.stack([e[0], e[1], 10 * e[2]]), np.array([1.0, 3.0, 100.0], np.float32))
            q = dnd(torch.from_numpy(e[:1])).item()
            assert q == pytest.approx(3.2 / 2.4, rel=1e-5), made_by
            dnd.write(e[:1], np.array([5.0], np.float32))
            assert dnd.values.weight[0, 0].item() == pytest.approx(2.0), made_by
            dnd.write(e[3:], np.array([7.0], np.float32))
            assert dnd.used == 3, made_by


def batch_of(obs, action, reward, discount, next_obs) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.tensor(obs, dtype=torch.float32),
        "action": torch.tensor(action),
        "reward": torch.tensor(reward, dtype=torch.float32),
        "discount": torch.tensor(discount, dtype=torch.float32),
        "next_obs": torch.tensor(next_obs, dtype=torch.float32),
    }


def test_nstep_targets_at_an_episode_end_and_first_writes_only():
    builder = make(n_step=3)
    (adder,) = builder.adders(1, builder.policy())
    items = []
    for t, done in enumerate([False, False, False, True]):
        out = adder.record(
            np.full((1, 4), t, np.float32), np.array([t % 2]), np.array([1.0]),
            np.array([done]), np.array([False]), np.full((1, 4), t + 1, np.float32),
        )  # fmt: skip
        items += [] if out is None else [out]
    columns = {k: np.concatenate([i[k] for i in items]) for k in items[0]}
    # Windows of 3 steps, then the ones the end cut short: their bootstrap is gone.
    gamma = builder.config.gamma
    np.testing.assert_allclose(columns["reward"], [1 + gamma + gamma**2] * 2 + [1 + gamma, 1])
    np.testing.assert_allclose(columns["discount"], [gamma**3, 0, 0, 0], rtol=1e-6)
    learning = builder.learning(builder.config, torch.device("cpu"))
    batch = {k: torch.from_numpy(v) for k, v in columns.items()}
    learning.update(batch, torch.ones(4), 1)
    dnds = learning.net.dnds
    # Empty DNDs before the writes: every target is the N-step return alone.
    written = sorted(dnds[0].values.weight[: dnds[0].used, 0].tolist())
    written += sorted(dnds[1].values.weight[: dnds[1].used, 0].tolist())
    assert (dnds[0].used, dnds[1].used) == (2, 2)
    np.testing.assert_allclose(written, sorted(columns["reward"][[0, 2]]) +
                               sorted(columns["reward"][[1, 3]]), rtol=1e-3)  # fmt: skip
    # Other items move the embedding; the first ones, sampled again, are trained on but not
    # written again (their keys have moved: a second write would take new slots).
    embedding = learning.net.embed[1].weight.detach().clone()
    other = {k: v + 10 if k in ("obs", "next_obs") else v for k, v in batch.items()}
    learning.update(other, torch.ones(4), 2)
    assert not torch.equal(learning.net.embed[1].weight, embedding)
    used = (dnds[0].used, dnds[1].used)
    assert used == (4, 4)
    learning.update(batch, torch.ones(4), 3)
    assert (dnds[0].used, dnds[1].used) == used


def test_training_moves_the_embedding_keys_and_values_and_actors_act_on_them():
    torch.manual_seed(0)
    builder = make()
    learning = builder.learning(builder.config, torch.device("cpu"))
    rng = np.random.default_rng(0)
    for step in range(1, 4):
        obs = rng.standard_normal((16, 4))
        batch = batch_of(obs, rng.integers(0, 2, 16), np.ones(16), np.full(16, 0.9),
                         obs + 0.1)  # fmt: skip
        before = {k: v.clone() for k, v in learning.net.state_dict().items()}
        priorities, figures = learning.update(batch, torch.ones(16), step)
    assert priorities is None and figures["dnd_size"] > 0
    after = learning.net.state_dict()
    for name in ("embed.1.weight", "dnds.0.keys.weight", "dnds.1.values.weight"):
        assert not torch.equal(before[name], after[name]), name
    parameters = learning.parameters()
    assert parameters["dnds.0.keys.weight"].shape == (50, 4)
    policy = builder.policy()
    policy.load(parameters)
    obs = rng.standard_normal((8, 4)).astype(np.float32)
    with torch.no_grad():
        want = learning.net(torch.from_numpy(obs)).argmax(1).numpy()
    np.testing.assert_array_equal(policy.act(obs, 0.0, rng), want)


def test_checkpoint_state_round_trip():
    builder = make()
    learning = builder.learning(builder.config, torch.device("cpu"))
    rng = np.random.default_rng(1)
    for step in range(1, 4):
        obs = rng.standard_normal((16, 4))
        batch = batch_of(obs, rng.integers(0, 2, 16), np.ones(16), np.full(16, 0.9), obs + 0.1)
        learning.update(batch, torch.ones(16), step)
    arrays, meta = learning.state()
    json.dumps(meta)
    restored = builder.learning(builder.config, torch.device("cpu"))
    restored.load_state(arrays, meta)
    for name, value in learning.net.state_dict().items():
        torch.testing.assert_close(restored.net.state_dict()[name], value)
    assert [d.clock for d in restored.net.dnds] == [d.clock for d in learning.net.dnds]
    again, _ = restored.state()
    assert set(again) == set(arrays)
    restored.update(batch, torch.ones(16), 4)  # the restored optimizers step


def test_published_dictionaries_are_refreshed_in_turn_and_never_older_than_refresh_versions():
    torch.manual_seed(0)
    rng = np.random.default_rng(2)

    def train(learning, step: int) -> dict[str, np.ndarray]:
        obs = rng.standard_normal((16, 4))
        batch = batch_of(obs, rng.integers(0, 2, 16), np.ones(16), np.full(16, 0.9), obs + 0.1)
        learning.update(batch, torch.ones(16), step)
        return {k: v.numpy().copy() for k, v in learning.net.state_dict().items()}

    builder = make(refresh_versions=4)  # dnd_capacity 50: 13 rows per version in turn
    learning = builder.learning(builder.config, torch.device("cpu"))
    for step in range(1, 6):
        live = train(learning, step)
    published = [learning.parameters()]  # the first version is the net whole
    lives = [live]
    for name, array in live.items():
        np.testing.assert_array_equal(published[0][name], array, err_msg=name)
    for step in range(6, 20):
        lives.append(train(learning, step))
        written = [set(d.written_slots) for d in learning.net.dnds]
        published.append(learning.parameters())
        now, live = published[-1], lives[-1]
        np.testing.assert_array_equal(now["embed.1.weight"], live["embed.1.weight"])
        for a, slots in enumerate(written):
            name = f"dnds.{a}.keys.weight"
            changed = set(np.flatnonzero((now[name] != published[-2][name]).any(axis=1)).tolist())
            fresh = set(np.flatnonzero((now[name] == live[name]).all(axis=1)).tolist())
            # The rows the update wrote are published at once; beside them at most a share of
            # ceil(50 / 4) = 13 rows changes per version.
            assert slots and slots <= fresh and len(changed - slots) <= 13, (step, a)
            # Each row is the learner's row of this version or of one of the 3 before it.
            recent = np.zeros(50, bool)
            for old in lives[-4:]:
                recent |= (now[name] == old[name]).all(axis=1)
            assert recent.all(), (step, a, np.flatnonzero(~recent))
            assert len(fresh) < 50 or step < 9  # rows the learner moved wait for their turn
    # With no update in between, 4 versions bring every row up to date.
    for _ in range(4):
        last = learning.parameters()
    for name, array in learning.net.state_dict().items():
        np.testing.assert_array_equal(last[name], array.numpy(), err_msg=name)
    # 1: every row, every version.
    exact = make(refresh_versions=1).learning(builder.config, torch.device("cpu"))
    for step in range(1, 4):
        live = train(exact, step)
        for name, array in exact.parameters().items():
            np.testing.assert_array_equal(array, live[name], err_msg=name)
