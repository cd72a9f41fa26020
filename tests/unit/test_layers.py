"""The import graph keeps its layers (docs/architecture.md#layers): services never import each
other, the algorithm layer imports no service, the replay and the plumbing import neither."""

import ast
import re
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"

# package under services/ -> apexrl packages its modules must never import
FORBIDDEN = {
    "actor": {"learner", "evaluator", "relay", "replay.server", "replay.table"},
    "learner": {"actor", "evaluator", "relay", "replay.server", "replay.table"},
    "evaluator": {"actor", "learner", "relay", "replay"},
    # The relay serves parameters: no torch (algorithms), no other service.
    "relay": {"actor", "learner", "evaluator", "replay", "algorithms"},
    "algorithms": {"actor", "learner", "evaluator", "relay", "replay"},
    "replay": {"actor", "learner", "evaluator", "relay", "algorithms"},
    "common": {"actor", "learner", "evaluator", "relay", "algorithms", "replay"},
}


def imported(path: Path) -> set[str]:
    """Every apexrl module a file imports (at any depth, lazily or not), without 'apexrl.'."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n[len("apexrl.") :] for n in names if n.startswith("apexrl.")}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_across_its_layer(package):
    files = sorted((SERVICES / package).rglob("*.py"))
    assert files, package
    crossings = [
        (str(f.relative_to(SERVICES)), name)
        for f in files
        for name in sorted(imported(f))
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[package])
    ]
    assert not crossings, crossings


def test_the_check_sees_an_import_it_forbids(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from apexrl.learner.service import build\n")
    assert "learner.service" in imported(sample)


# The services run whatever algorithm their builder is: no family flag, no algorithm's name.
ALGORITHM_WORDS = re.compile(
    r"unrolls?|current_version_only|\b(dqn|dpg|impala|ppo|r2d2|nec|unreal|rainbow)\b", re.I
)


def algorithm_words(path: Path) -> list[str]:
    """Lines of a file (code, strings and comments alike) naming an algorithm or a family."""
    return [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ALGORITHM_WORDS.search(line)
    ]


@pytest.mark.parametrize("package", ["actor", "learner", "evaluator", "relay"])
def test_services_never_name_an_algorithm_or_its_family(package):
    found = [hit for f in sorted((SERVICES / package).rglob("*.py")) for hit in algorithm_words(f)]
    assert not found, found


def test_the_algorithm_check_sees_a_family_flag(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("if algorithm.unrolls:\n    pass\nname = 'PPO'\n")
    assert len(algorithm_words(sample)) == 2
