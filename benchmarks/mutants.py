"""Mutation testing of the code where a quiet bug costs most: the losses, the adders, the
samplers, the rate limiters and the learner's priority write-back (`make mutants`).

mutmut (3.x) makes small changes to a module one at a time (an operator, a constant, an
argument dropped) and runs the fast unit tests that reach the changed function; a mutant that
no test fails is a survivor, either a gap in the tests or a change that cannot be told apart
(docs/testing.md lists them with the reason). A figure, not a gate: not part of `make test`.

mutmut imports a package from a folder named as the package (src/apexrl); this repository's
is services/ (package-dir apexrl = services). So each group runs in a copy laid out that way,
mutmut's settings written there as setup.cfg [mutmut]; the working tree is never touched.

    python benchmarks/mutants.py                     # every group; about an hour on 2 cores
    python benchmarks/mutants.py samplers adders     # some groups
    python benchmarks/mutants.py --ref HEAD          # a commit instead of the working tree
"""

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Group:
    modules: list[str]  # under services/
    tests: list[str]  # the fast unit tests that cover them
    functions: list[str] | None = None  # mutant name globs (None: every function)


GROUPS = {
    "losses": Group(
        [
            "algorithms/dqn/losses.py",
            "algorithms/dpg/losses.py",
            "algorithms/r2d2/losses.py",
            "algorithms/unreal/losses.py",
            "algorithms/ppo/losses.py",
        ],
        [
            "tests/unit/test_loss.py",
            "tests/unit/test_c51.py",
            "tests/unit/test_dpg.py",
            "tests/unit/test_r2d2.py",
            "tests/unit/test_unreal.py",
            "tests/unit/test_ppo_loss.py",
            "tests/unit/test_on_policy_reference.py",
        ],
    ),
    "adders": Group(
        [
            "algorithms/adders/nstep.py",
            "algorithms/adders/sequence.py",
            "algorithms/adders/unroll.py",
            "algorithms/unreal/adders.py",
        ],
        [
            "tests/unit/test_adder_contract.py",
            "tests/unit/test_nstep.py",
            "tests/unit/test_sequence_adder.py",
            "tests/unit/test_unrolls.py",
            "tests/unit/test_unreal.py",
            "tests/unit/test_r2d2.py",
            "tests/unit/test_frame_stacks.py",
        ],
    ),
    "samplers": Group(
        ["replay/samplers.py"],
        [
            "tests/unit/test_samplers.py",
            "tests/unit/test_sampler_contract.py",
            "tests/unit/test_table.py",
        ],
    ),
    "rate_limiters": Group(
        ["replay/rate_limiters.py"],
        [
            "tests/unit/test_rate_limiter_contract.py",
            "tests/unit/test_table.py",
            "tests/unit/test_samplers.py",
            "tests/unit/test_local_settings.py",
        ],
    ),
    "write_back": Group(
        ["learner/training.py"],
        ["tests/unit/test_priority_writes.py", "tests/unit/test_learner_write_back.py"],
        [
            "*.x_write_priorities__mutmut_*",
            "*.x__send_priorities__mutmut_*",
            "*.xǁLearnerǁ_update__mutmut_*",
        ],
    ),
}

# mutmut's exit codes per mutant, as its results name them; a timeout counts as a kill (the
# mutant never finishes where the code does).
STATUS = {
    0: "survived",
    1: "killed",
    3: "killed",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "killed",
    -9: "segfault",
    -11: "segfault",
    None: "not checked",
}


def lay_out(work: Path, ref: str | None) -> None:
    """services/ as src/apexrl, with tests/ and pyproject.toml, from the working tree or `ref`."""
    if ref is None:
        shutil.copytree(
            ROOT / "services", work / "src" / "apexrl", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copytree(
            ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "services", "tests", "pyproject.toml"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        (work / "src").mkdir()
        (work / "services").rename(work / "src" / "apexrl")


def settings(group: Group) -> str:
    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    return (
        "[mutmut]\n"
        "source_paths = src/apexrl\n"
        f"only_mutate ={lines(['src/apexrl/' + m for m in group.modules])}\n"
        f"pytest_add_cli_args_test_selection ={lines(group.tests)}\n"
        f"pytest_add_cli_args ={lines(['-m', 'not slow', '-p', 'no:cacheprovider'])}\n"
    )


def results(work: Path) -> dict[str, int | None]:
    """Exit code of every mutant mutmut made, by name."""
    codes: dict[str, int | None] = {}
    for meta in (work / "mutants").rglob("*.py.meta"):
        codes |= json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def run_group(name: str, group: Group, args, report: dict) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"mutants-{name}-", dir=args.scratch))
    lay_out(work, args.ref)
    (work / "setup.cfg").write_text(settings(group))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    command = [
        "nice",
        "-n",
        "19",
        "timeout",
        str(args.timeout),
        sys.executable,
        "-m",
        "mutmut",
        "run",
        "--max-children",
        str(args.jobs),
        *(group.functions or []),
    ]
    started = time.monotonic()
    run = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    codes = results(work)
    if group.functions:
        codes = {
            k: v for k, v in codes.items() if any(fnmatch.fnmatch(k, f) for f in group.functions)
        }
    by_status: dict[str, list[str]] = {}
    for mutant, code in sorted(codes.items()):
        by_status.setdefault(STATUS.get(code, "suspicious"), []).append(mutant)
    checked = sum(len(v) for k, v in by_status.items() if k not in ("not checked", "skipped"))
    killed = len(by_status.get("killed", [])) + len(by_status.get("timeout", []))
    score = killed / checked if checked else 0.0
    print(
        f"{name}: {killed}/{checked} mutants killed ({score:.1%}) in {seconds:.0f} s;"
        f" {', '.join(f'{k} {len(v)}' for k, v in sorted(by_status.items()))}"
    )
    if run.returncode != 0 and not codes:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
    diffs = {}
    for mutant in by_status.get("survived", []) + by_status.get("no tests", []):
        shown = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", mutant],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        diffs[mutant] = shown.stdout
    report[name] = {
        "killed": killed,
        "checked": checked,
        "seconds": round(seconds),
        "by_status": by_status,
        "survivors": diffs,
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help=f"of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--ref", help="a commit to test instead of the working tree")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per group at most")
    parser.add_argument("--scratch", default=None, help="where the copies go (a temp folder)")
    parser.add_argument(
        "--report",
        help="a file for every mutant's status and the survivors'"
        " diffs, as JSON (default: in a temporary folder)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the copies")
    args = parser.parse_args()
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        parser.error(f"groups: unknown {sorted(unknown)}, choose from {list(GROUPS)}")
    report: dict = {}
    for name in args.groups or list(GROUPS):
        run_group(name, GROUPS[name], args, report)
    killed = sum(r["killed"] for r in report.values())
    checked = sum(r["checked"] for r in report.values())
    print(f"all: {killed}/{checked} mutants killed ({killed / max(checked, 1):.1%})")
    path = Path(args.report or Path(tempfile.mkdtemp(prefix="mutants-")) / "report.json")
    path.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"report: {path}")


if __name__ == "__main__":
    main()
