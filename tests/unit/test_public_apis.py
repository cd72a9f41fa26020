"""Metrics are read through prometheus_client's public API (a registry's get_sample_value, or
a plain number kept beside the metric), never through a metric's private `_value`, which the
library may change in any release."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for folder in ("services", "tests", "benchmarks")
    for p in (REPO / folder).rglob("*.py")
    if "v1" not in p.relative_to(REPO).parts
)


def private_reads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "_value"
    ]


def test_there_are_sources_to_check():
    assert any(p.name == "metrics.py" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_metric_is_read_through_its_private_value(path):
    assert private_reads(path) == []
