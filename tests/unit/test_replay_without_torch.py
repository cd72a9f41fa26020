import subprocess
import sys


def test_replay_service_imports_without_torch():
    """The replay image has no torch: nothing on its import path may need it."""
    code = (
        "import sys; import apexrl.cli, apexrl.replay.server, apexrl.replay.client; "
        "assert 'torch' not in sys.modules and 'gymnasium' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_relay_imports_without_torch():
    """The relay runs from the replay's torch-free image (deploy/Dockerfile)."""
    code = (
        "import sys; import apexrl.cli, apexrl.relay.server; "
        "assert 'torch' not in sys.modules and 'gymnasium' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
