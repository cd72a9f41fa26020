"""The settings local mode writes for its services: an algorithm's defaults, one env's on top,
the user's file over both."""

import tomllib

from apexrl import config as cfg
from apexrl import local


def learner_settings(tmp_path, env, user_file=None):
    config = cfg.parse(cfg.LocalConfig, ["--algorithm", "impala", "--env", env], "local", "x")
    run = local.Run(config, user_file or {}, tmp_path / env)
    return tomllib.loads(run.config_path.read_text())["learner"]


def test_impala_on_acrobot_takes_its_env_settings_and_a_user_file_overrides_them(tmp_path):
    cartpole = learner_settings(tmp_path, "CartPole-v1")
    acrobot = learner_settings(tmp_path, "Acrobot-v1")
    assert (cartpole["passes"], cartpole["gae_lambda"], cartpole["normalize_advantages"]) == (
        2, 1.0, False)  # fmt: skip
    assert (acrobot["passes"], acrobot["gae_lambda"], acrobot["normalize_advantages"]) == (
        20, 0.8, True)  # fmt: skip
    assert acrobot["batch_size"] == cartpole["batch_size"] == 8  # the algorithm's, kept
    mine = learner_settings(tmp_path, "Acrobot-v1", {"learner": {"passes": 3}})
    assert mine["passes"] == 3 and mine["gae_lambda"] == 0.8
