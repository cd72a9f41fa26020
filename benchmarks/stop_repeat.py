"""Stops every service of each algorithm many times and counts what went wrong.

Runs tests/e2e/test_prompt_stops.py (local mode's services, trained, each stopped with SIGTERM
at a moment of its own) `--count` times per algorithm and stop order, with pytest-repeat, and
prints per algorithm and order: runs, exits that were not 0 (which service, which code) and
stops slower than the test's bound (which service, how long). A race in a stop path shows as
a rare non-zero exit here long before it fails CI.

    .venv/bin/python benchmarks/stop_repeat.py --count 25                 # every algorithm, both orders
    .venv/bin/python benchmarks/stop_repeat.py --count 50 --algorithms ppo --orders alone

A run takes ~9 s on an idle 2-core machine: 25 per order for the 8 algorithms is ~1 hour.
"""

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/e2e/test_prompt_stops.py::test_every_service_stops_within_seconds_of_sigterm"
ALGORITHMS = ["dpg", "dqn", "impala", "nec", "ppo", "r2d2", "rainbow", "unreal"]
ORDERS = ["alone", "local"]
CASE = re.compile(r"\[(?P<algorithm>\w+)-(?P<order>\w+)-\d+-\d+\]")
EXITED = re.compile(r"(?P<algorithm>\w+) (?P<service>[\w-]+) exited (?P<code>-?\d+)")
SLOW = re.compile(r"(?P<algorithm>\w+) (?P<service>[\w-]+) took (?P<seconds>[\d.]+) s to stop")


def outcomes(junit: Path) -> list[dict]:
    """One dict per test case of a pytest junit file: algorithm, order, and what failed."""
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        match = CASE.search(case.get("name", ""))
        if match is None:
            continue
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        message = "" if failure is None else (failure.get("message") or failure.text or "")
        exited, slow = EXITED.search(message), SLOW.search(message)
        cases.append(
            {
                **match.groupdict(),
                "failed": failure is not None,
                "exited": f"{exited['service']} {exited['code']}" if exited else None,
                "slow": f"{slow['service']} {slow['seconds']} s" if slow else None,
                "other": message.splitlines()[0][:200]
                if failure is not None and not (exited or slow)
                else None,
            }
        )
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50, help="runs per algorithm and order")
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    parser.add_argument("--orders", nargs="+", default=ORDERS, choices=ORDERS)
    args = parser.parse_args()
    cases = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in args.algorithms:
            for order in args.orders:
                junit = Path(tmp) / f"{algorithm}-{order}.xml"
                command = [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    TEST,
                    "-k",
                    f"{algorithm} and {order}",
                    "--count",
                    str(args.count),
                    f"--junitxml={junit}",
                ]
                subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
                found = outcomes(junit) if junit.exists() else []
                cases += found
                failed = [c for c in found if c["failed"]]
                print(
                    f"{algorithm:8} {order:6} runs {len(found):3}  failed {len(failed)}"
                    + "".join(
                        f"  [{c['exited'] and 'exit ' + c['exited'] or ''}"
                        f"{c['slow'] and 'slow ' + c['slow'] or ''}{c['other'] or ''}]"
                        for c in failed
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    nonzero = collections.Counter(c["exited"] for c in cases if c["exited"])
    slow = [c["slow"] for c in cases if c["slow"]]
    summary = {
        "runs": len(cases),
        "failed": sum(c["failed"] for c in cases),
        "nonzero_exits": dict(nonzero),
        "slow_stops": slow,
        "other_failures": [c["other"] for c in cases if c["other"]],
        "by_algorithm": {
            f"{a}-{o}": sum(1 for c in cases if (c["algorithm"], c["order"]) == (a, o))
            for a in args.algorithms
            for o in args.orders
        },
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
