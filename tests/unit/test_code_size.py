"""Hand-written modules stay readable: none over 500 lines, no function over 80 (services/v1 is
generated, and left out). A module or function past them holds more than one concept: split it."""

import ast
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules() -> list[Path]:
    return sorted(p for p in SERVICES.rglob("*.py") if "v1" not in p.relative_to(SERVICES).parts)


def name(path: Path) -> str:
    return str(path.relative_to(SERVICES.parent))


def test_the_services_have_modules_to_check():
    assert any(p.name == "table.py" for p in modules())


@pytest.mark.parametrize("path", modules(), ids=name)
def test_no_module_over_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name(path)} has {lines} lines"


@pytest.mark.parametrize("path", modules(), ids=name)
def test_no_function_over_80_lines(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    long = [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{name(path)}: " + "; ".join(long)
