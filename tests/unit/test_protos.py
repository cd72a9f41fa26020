import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_generated_code_matches_the_protos():
    spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert generate.differences() == [], "run: python protos/generate.py"


def test_every_service_and_rpc_is_documented():
    """Each service and rpc in the .proto files has a comment right above it."""
    for proto in (ROOT / "protos" / "apexrl" / "v1").glob("*.proto"):
        lines = [line.strip() for line in proto.read_text().splitlines()]
        for i, line in enumerate(lines):
            if line.startswith(("rpc ", "service ")):
                assert lines[i - 1].startswith("//"), f"{proto.name}:{i + 1}: {line}"
