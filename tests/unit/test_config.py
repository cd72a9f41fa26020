import dataclasses
import subprocess
import sys

import pytest

from apexrl.config import ReplayConfig, parse


def test_precedence_defaults_file_env_flags(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text(
        "capacity = 10\nport = 1\n[replay]\ncapacity = 20\nalpha = 0.1\n[learner]\nx = 1\n"
    )
    monkeypatch.setenv("APEXRL_ALPHA", "0.2")
    config = parse(ReplayConfig, ["--config", str(path), "--port", "7"], "replay", "t")
    assert (config.capacity, config.alpha, config.port) == (20, 0.2, 7)
    assert config.table == "default"  # untouched default


def test_unknown_key_in_own_section_is_an_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[replay]\ncapacityy = 20\n")
    with pytest.raises(SystemExit):
        parse(ReplayConfig, ["--config", str(path)], "replay", "t")


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("APEXRL_CAPACITY", "lots")
    with pytest.raises(ValueError, match="APEXRL_CAPACITY"):
        parse(ReplayConfig, [], "replay", "t")


def test_help_documents_every_setting():
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "replay", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    for field in dataclasses.fields(ReplayConfig):
        if field.metadata.get("file_only"):  # an array of tables: the epilog documents it
            assert f"{field.name}: config file only" in " ".join(result.stdout.split())
            continue
        flag = "--" + field.name.replace("_", "-")
        assert flag in result.stdout and f"APEXRL_{field.name.upper()}" in result.stdout


def test_top_level_help_lists_commands():
    result = subprocess.run(
        [sys.executable, "-m", "apexrl.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "replay" in result.stdout
