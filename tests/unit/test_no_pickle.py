"""Nothing that crosses a process boundary or comes from disk is unpickled."""

import re
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "services"
FORBIDDEN = re.compile(
    r"\bimport pickle\b|\bpickle\.loads?\b|\btorch\.load\b|allow_pickle\s*=\s*True|\bcloudpickle\b"
)


def test_services_never_unpickle():
    offenders = [
        f"{path.relative_to(SERVICES.parent)}:{number}: {line.strip()}"
        for path in SERVICES.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not offenders, offenders
