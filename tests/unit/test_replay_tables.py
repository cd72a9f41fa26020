"""One source for a replay table's settings: the algorithm's `[<algorithm>]` table. Local mode's
replay, `apexrl tables` and every Kubernetes config (deploy/k8s/01-config.yaml and each
overlay's apexrl.toml) take their tables from it; two places for one setting are refused."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from apexrl import config as cfg
from apexrl.local.settings import parse, replay_tables
from apexrl.replay_tables import MARKER, config_text, declared_tables, render, with_block

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("deploy/kustomize/overlays/*/apexrl.toml")) + [
    ROOT / "deploy/k8s/01-config.yaml"
]
NAMES = [p.relative_to(ROOT).as_posix() for p in CONFIGS]


def test_every_config_with_tables_is_listed():
    with_tables = {
        p.relative_to(ROOT).as_posix()
        for p in ROOT.glob("deploy/**/*")
        if p.suffix in (".toml", ".yaml") and "[[replay.tables]]" in p.read_text()
    }
    assert with_tables == set(NAMES)


@pytest.mark.parametrize("path", CONFIGS, ids=NAMES)
def test_the_checked_in_tables_are_what_the_algorithm_settings_make(path):
    """Each file's block is what `apexrl tables --write` writes: nobody edited it by hand."""
    text = path.read_text()
    assert with_block(text, render(declared_tables(path, [])), path) == text, (
        f"run: apexrl tables --config {path.relative_to(ROOT)} --write"
    )


@pytest.mark.parametrize("path", CONFIGS, ids=NAMES)
def test_changing_the_algorithm_setting_changes_the_replay_table(path, tmp_path):
    """capacity and min_size_to_sample set in [<algorithm>] (the one place) reach the
    generated [[replay.tables]], which the replay then serves."""
    data = tomllib.loads(config_text(path))
    algorithm = data["algorithm"]
    toml = tmp_path / "apexrl.toml"
    text = config_text(path)
    if "capacity" in data[algorithm]:
        text = re.sub(r"(?m)^capacity = .*$", "capacity = 12_345", text, count=1)
    else:
        text = text.replace(f"[{algorithm}]\n", f"[{algorithm}]\ncapacity = 12_345\n", 1)
    assert tomllib.loads(text)[algorithm]["capacity"] == 12_345
    toml.write_text(text)
    new = with_block(text, render(declared_tables(toml, [])), toml)
    replay = tomllib.loads(new)["replay"]
    assert replay["tables"][0]["capacity"] == 12_345
    served = cfg.ReplayConfig(**replay)
    assert served.table_configs()[0].capacity == 12_345
    assert new.count("capacity = 12_345") == 2  # the setting and its table, nowhere else


@pytest.mark.parametrize("algorithm", ["dqn", "rainbow", "r2d2", "nec", "ppo", "impala"])
def test_local_mode_takes_the_same_setting(algorithm):
    settings = parse(["--algorithm", algorithm, "--capacity", "4321", "--replay-shards", "1"])
    (table, *_) = replay_tables(settings, 1)
    assert table["capacity"] == 4321


def test_the_command_prints_the_tables_and_writes_only_its_block(tmp_path):
    path = tmp_path / "apexrl.toml"
    path.write_text(
        'algorithm = "ppo"\nenv = "CartPole-v1"\n\n[ppo]\ncapacity = 32\n\n[replay]\n'
        f'grace_seconds = 5.0\n\n{MARKER}\n[[replay.tables]]\nname = "old"\n\n'
        "[learner]\nbatch_size = 8\n"
    )
    command = [sys.executable, "-m", "apexrl.cli", "tables", "--config", str(path)]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert printed.startswith('[[replay.tables]]\nname = "default"\ncapacity = 32\n')
    assert "alpha" not in printed and "min_size_to_sample" not in printed  # a queue's
    subprocess.run([*command, "--write"], check=True)
    data = tomllib.loads(path.read_text())
    assert [t["name"] for t in data["replay"]["tables"]] == ["default"]
    assert data["replay"]["tables"][0]["capacity"] == 32
    assert data["learner"] == {"batch_size": 8} and data["replay"]["grace_seconds"] == 5.0


def test_a_file_without_the_marker_is_refused_naming_it(tmp_path):
    path = tmp_path / "apexrl.toml"
    path.write_text('algorithm = "dqn"\n')
    command = [sys.executable, "-m", "apexrl.cli", "tables", "--config", str(path), "--write"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    assert f"{path}: needs the line" in result.stderr
    assert path.read_text() == 'algorithm = "dqn"\n'


def test_an_unknown_key_in_the_algorithm_table_is_refused_naming_table_and_file(tmp_path):
    path = tmp_path / "apexrl.toml"
    path.write_text('algorithm = "dqn"\n[dqn]\ncapacty = 5\n')
    command = [sys.executable, "-m", "apexrl.cli", "tables", "--config", str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    assert re.search(rf"{re.escape(str(path))}: \[dqn\] has unknown key 'capacty'", result.stderr)


@pytest.mark.parametrize("flat", [{"capacity": 5}, {"alpha": 0.5}, {"table": "other"}])
def test_a_table_setting_in_two_places_is_refused_naming_it(flat):
    name = next(iter(flat))
    with pytest.raises(ValueError, match=f"^{name}: a flat table setting beside"):
        cfg.ReplayConfig(tables=[{"name": "default"}], **flat)
    cfg.ReplayConfig(**flat)  # alone, the flat settings are the one table
