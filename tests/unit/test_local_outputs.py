"""`apexrl local`'s --video-every and --tensorboard refuse what cannot work with one line
naming the setting, exit 2, before any service starts."""

import pytest

from apexrl import cli


def local(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(["local", *map(str, argv)])
    return exited.value.code


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--video-every", "-1"], "video_every: must be >= 0 (0: no videos), got -1"),
        (["--tensorboard", "{blocker}/events"], "tensorboard: cannot write to {blocker}/events"),
    ],
)
def test_refused_with_one_line_and_no_service_started(tmp_path, capsys, flags, message):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    flags = [f.format(blocker=blocker) for f in flags]
    assert local("--run-dir", tmp_path / "run", *flags) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("apexrl local: error: " + message.format(blocker=blocker))
    assert len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "run").glob("logs/*.log"))  # a service's log: it was started
    assert blocker.read_text() == "not a folder"
