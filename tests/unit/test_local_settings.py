"""The settings local mode writes for its services: an algorithm's defaults, one env's on top,
the user's file over both."""

import re
import tomllib

import pytest

from apexrl.local.settings import dump_toml, parse, signature
from apexrl.local.supervision import Run


def written(tmp_path, env, user_file=None, *flags, algorithm="impala"):
    """The config.toml local mode writes for `algorithm` on `env`."""
    path = tmp_path / "user.toml"
    path.write_text(dump_toml(user_file or {}))
    argv = ["--algorithm", algorithm, "--env", env, "--config", str(path), *flags]
    run = Run(parse(argv), user_file or {}, tmp_path / env)
    return tomllib.loads(run.config_path.read_text())


def test_impala_on_acrobot_takes_its_env_presets_and_a_user_file_overrides_them(tmp_path):
    cartpole = written(tmp_path, "CartPole-v1")["impala"]
    acrobot = written(tmp_path, "Acrobot-v1")["impala"]
    assert (cartpole["passes"], cartpole["gae_lambda"], cartpole["normalize_advantages"]) == (
        2, 1.0, False)  # fmt: skip
    assert (acrobot["passes"], acrobot["gae_lambda"], acrobot["normalize_advantages"]) == (
        20, 0.8, True)  # fmt: skip
    mine = written(tmp_path, "Acrobot-v1", {"impala": {"passes": 3}})
    assert mine["impala"]["passes"] == 3 and mine["impala"]["gae_lambda"] == 0.8
    assert mine["learner"]["batch_size"] == 8  # the algorithm's preset, kept
    flagged = written(tmp_path, "Acrobot-v1", {"impala": {"passes": 3}}, "--passes", "5")
    assert flagged["impala"]["passes"] == 5  # flags beat the file


@pytest.mark.parametrize("algorithm", ["impala", "unreal"])
def test_the_actor_critics_learn_atari_at_impalas_published_rate(tmp_path, algorithm):
    """IMPALA's learning rate and gradient clip on Atari, one pass per batch; the small
    machine's elsewhere (and unreal's pixel control is on only for frames)."""
    pong = written(tmp_path, "ALE/Pong-v5", algorithm=algorithm)
    cartpole = written(tmp_path, "CartPole-v1", algorithm=algorithm)
    assert (pong["learner"]["learning_rate"], pong["learner"]["max_grad_norm"]) == (6e-4, 40.0)
    assert (pong[algorithm]["passes"], cartpole[algorithm]["passes"]) == (1, 2)
    assert cartpole["learner"]["learning_rate"] == 2e-3
    assert cartpole["learner"].get("max_grad_norm", 10.0) == 10.0
    if algorithm == "unreal":
        assert (pong["unreal"]["pc_lambda"], cartpole["unreal"]["pc_lambda"]) == (0.05, 0.0)


def test_rainbow_learns_atari_at_c51s_published_rate_and_dqn_at_cleanrls(tmp_path):
    def rate(algorithm, env):
        return written(tmp_path, env, algorithm=algorithm)["learner"].get("learning_rate")

    assert rate("rainbow", "ALE/Pong-v5") == 2.5e-4 and rate("dqn", "ALE/Pong-v5") == 1e-4
    assert rate("rainbow", "CartPole-v1") == rate("dqn", "CartPole-v1")


@pytest.mark.parametrize("algorithm, ends", [("dqn", True), ("rainbow", True), ("impala", False)])
def test_dqns_atari_actors_end_the_returns_at_a_lost_life(tmp_path, algorithm, ends):
    """CleanRL's and Nature DQN's training protocol for Breakout, local mode's Atari preset of
    the dqn family; the game and its evaluation go on to the last life."""
    actor = written(tmp_path, "ALE/Breakout-v5", algorithm=algorithm)["actor"]
    assert (actor.get("life_loss_terminal", False), actor["num_envs"]) == (ends, 4)
    mine = written(tmp_path, "ALE/Breakout-v5", {"actor": {"life_loss_terminal": False}},
                   algorithm=algorithm)  # fmt: skip
    assert mine["actor"]["life_loss_terminal"] is False
    assert written(tmp_path, "CartPole-v1", algorithm=algorithm)["actor"].get(
        "life_loss_terminal", False) is False  # fmt: skip


def test_the_replay_tables_are_the_builders_split_over_the_shards(tmp_path):
    tables = written(tmp_path, "CartPole-v1", {}, "--replay-shards", "2")["replay"]["tables"]
    assert [(t["name"], t["sampler"], t["rate_limiter"], t["capacity"]) for t in tables] == [
        ("default", "fifo", "queue", 32)]  # fmt: skip
    assert tables[0]["signature"] == signature(parse(["--algorithm", "impala"]))


@pytest.mark.parametrize(
    "user_file, message",
    [
        ({"replay": {"capacity": 10}}, r"\[replay\] capacity: .* set its sizes in \[impala\]"),
        ({"ppo": {"epochs": 3}}, None),  # another registered algorithm's table: checked, kept
        ({"impala": {"epochs": 3}}, r"\[impala\] has unknown key 'epochs'"),
        ({"r2d3": {"burn_in": 3}}, r"unknown table \[r2d3\]"),
    ],
)
def test_bad_settings_fail_before_any_process_naming_the_table(tmp_path, user_file, message):
    if message is None:
        assert written(tmp_path, "CartPole-v1", user_file)["impala"]["passes"] == 2
        return
    with pytest.raises((ValueError, SystemExit)) as caught:
        written(tmp_path, "CartPole-v1", user_file)
    assert not (tmp_path / "CartPole-v1" / "config.toml").exists()
    if caught.type is ValueError:
        assert re.search(message, str(caught.value)), caught.value


def test_a_flag_of_another_algorithm_is_named(capsys):
    with pytest.raises(SystemExit):
        parse(["--algorithm", "dqn", "--epochs", "3"])
    assert "--epochs is a setting of algorithm ppo, not of dqn" in capsys.readouterr().err


def test_ppo_learns_atari_with_cleanrls_ppo_atari_settings(tmp_path):
    """CleanRL's ppo_atari as the learner and the actors read local mode's config: 8 envs x 128
    steps a batch (2 actors x 4 envs, 8 unrolls of 128 steps), 4 epochs of 4 minibatches, clip
    0.1, Adam at 2.5e-4 decayed linearly to 0 over 10M env steps (9,765 updates of 1,024)."""
    from apexrl import algorithms
    from apexrl import config as cfg
    from apexrl.schedules import Schedule

    run = Run(parse(["--algorithm", "ppo", "--env", "ALE/Breakout-v5"]), {}, tmp_path / "run")
    argv = ["--config", str(run.config_path)]
    learner = cfg.parse(cfg.LearnerConfig, argv, "learner", "learner", algorithms.REGISTRY)
    actor = cfg.parse(cfg.ActorConfig, argv, "actor", "actor", algorithms.REGISTRY)
    ppo = learner.algo
    assert (run.config.actors, actor.num_envs, ppo.unroll_length, learner.batch_size) == (
        2, 4, 128, 8)  # fmt: skip
    assert (ppo.epochs, ppo.minibatches, ppo.clip_range, ppo.gae_lambda) == (4, 4, 0.1, 0.95)
    assert (ppo.entropy_cost, ppo.value_cost, learner.max_grad_norm) == (0.01, 0.5, 0.5)
    assert (ppo.normalize_advantages, ppo.optimizer, ppo.optimizer_eps) == (True, "adam", 1e-5)
    assert (learner.gamma, actor.gamma) == (0.99, 0.99)
    rate = learner.learning_rate
    assert isinstance(rate, Schedule) and rate.shape == "linear"
    assert [rate.value(u) for u in (0, 9765 / 2, 9765, 20_000)] == pytest.approx(
        [2.5e-4, 1.25e-4, 0.0, 0.0]
    )
    # Elsewhere ppo keeps its CartPole settings.
    cartpole = written(tmp_path, "CartPole-v1", algorithm="ppo")
    assert (cartpole["ppo"]["epochs"], cartpole["learner"]["learning_rate"]) == (20, 2e-3)
