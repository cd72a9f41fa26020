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
    python benchmarks/mutants.py losses              # every losses_* group
    python benchmarks/mutants.py --ref HEAD          # a commit instead of the working tree
    python benchmarks/mutants.py losses_r2d2 --mutants '*rescale__mutmut_3'   # one again

torch runs on one thread (OMP_NUM_THREADS=1): mutmut forks each mutant from a process that
has run the tests, and an OpenMP pool started there hangs in the fork, which would count
as a kill by timeout.
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
    # One group per algorithm's loss, with the tests that reach it: each runs (and is
    # reported) on its own, and "losses" names them all.
    "losses_dqn": Group(
        ["algorithms/dqn/losses.py"],
        ["tests/unit/test_loss.py", "tests/unit/test_c51.py"],
    ),
    "losses_dpg": Group(["algorithms/dpg/losses.py"], ["tests/unit/test_dpg.py"]),
    "losses_r2d2": Group(["algorithms/r2d2/losses.py"], ["tests/unit/test_r2d2.py"]),
    "losses_unreal": Group(["algorithms/unreal/losses.py"], ["tests/unit/test_unreal.py"]),
    "losses_a3c": Group(["algorithms/a3c/losses.py"], ["tests/unit/test_a3c.py"]),
    "losses_ppo": Group(
        ["algorithms/ppo/losses.py"],
        [
            "tests/unit/test_ppo_loss.py",
            "tests/unit/test_ppo_kl.py",
            "tests/unit/test_on_policy_reference.py",
            "tests/unit/test_vtrace.py",
        ],
    ),
    # The actor's side of dqn: acting, its Q-values kept for the initial priorities.
    "acting_dqn": Group(["algorithms/dqn/acting.py"], ["tests/unit/test_acting_priorities.py"]),
    "pretraining": Group(["learner/pretraining.py"], ["tests/unit/test_pretraining.py"]),
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
        ["learner/write_back.py", "learner/training.py"],
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


def settings(group: Group, work: Path, timeout_multiplier: float) -> str:
    """mutmut's [mutmut] section; test files the copy lacks (at an older --ref) are left out."""

    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    tests = [t for t in group.tests if (work / t).exists()]
    return (
        "[mutmut]\n"
        "source_paths = src/apexrl\n"
        f"only_mutate ={lines(['src/apexrl/' + m for m in group.modules])}\n"
        f"pytest_add_cli_args_test_selection ={lines(tests)}\n"
        f"pytest_add_cli_args ={lines(['-m', 'not slow', '-p', 'no:cacheprovider'])}\n"
        f"timeout_multiplier = {timeout_multiplier}\n"
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
    (work / "setup.cfg").write_text(settings(group, work, args.timeout_multiplier))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    functions = args.mutants or group.functions
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
        *(functions or []),
    ]
    started = time.monotonic()
    run = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    codes = results(work)
    if functions:
        codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatch(k, f) for f in functions)}
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
    parser.add_argument(
        "groups",
        nargs="*",
        help=f"of {', '.join(GROUPS)}, or a family (losses: every losses_* group); default: all",
    )
    parser.add_argument("--ref", help="a commit to test instead of the working tree")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per group at most")
    parser.add_argument(
        "--timeout-multiplier",
        type=float,
        default=15.0,
        help="a mutant whose tests run past this many times their time (plus 1 s) counts as"
        " killed by timeout",
    )
    parser.add_argument(
        "--mutants",
        nargs="+",
        help="mutant name globs to run (again) instead of the group's (one group)",
    )
    parser.add_argument("--scratch", default=None, help="where the copies go (a temp folder)")
    parser.add_argument(
        "--report",
        help="a file for every mutant's status and the survivors'"
        " diffs, as JSON (default: in a temporary folder)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the copies")
    args = parser.parse_args()
    names = [
        group
        for wanted in args.groups or list(GROUPS)
        for group in GROUPS
        if group == wanted or group.startswith(wanted + "_")
    ]
    unknown = {w for w in args.groups if not any(n == w or n.startswith(w + "_") for n in names)}
    if unknown:
        parser.error(f"groups: unknown {sorted(unknown)}, choose from {list(GROUPS)}")
    if args.mutants and len(names) != 1:
        parser.error(f"--mutants: name one group, not {names}")
    report: dict = {}
    for name in dict.fromkeys(names):
        run_group(name, GROUPS[name], args, report)
    killed = sum(r["killed"] for r in report.values())
    checked = sum(r["checked"] for r in report.values())
    print(f"all: {killed}/{checked} mutants killed ({killed / max(checked, 1):.1%})")
    path = Path(args.report or Path(tempfile.mkdtemp(prefix="mutants-")) / "report.json")
    path.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"report: {path}")


if __name__ == "__main__":
    main()
