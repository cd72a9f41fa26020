"""Generate the Python code for protos/apexrl/v1/*.proto into services/v1/ (= apexrl.v1).

    python protos/generate.py            # rewrite services/v1/
    python protos/generate.py --check    # exit 1 if the checked-in code differs

The generated files are checked in; tests/unit/test_protos.py runs --check.
"""

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
TARGET = ROOT / "services" / "v1"


def generate(out_dir: Path) -> list[Path]:
    """Runs protoc into out_dir; returns the generated files (flattened, no package dirs)."""
    sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "apexrl" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTOS}", f"--python_out={tmp}", f"--pyi_out={tmp}"]
        args += [f"--grpc_python_out={tmp}", *sources]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        generated = []
        for f in sorted((Path(tmp) / "apexrl" / "v1").iterdir()):
            shutil.copy(f, out_dir / f.name)
            generated.append(out_dir / f.name)
        return generated


def differences() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name for p in generate(Path(tmp))}
        present = {p.name for p in TARGET.glob("*_pb2*.py*")}
        diffs = sorted(fresh ^ present)
        diffs += [
            n
            for n in sorted(fresh & present)
            if not filecmp.cmp(Path(tmp) / n, TARGET / n, shallow=False)
        ]
        return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if services/v1 is stale")
    if parser.parse_args().check:
        diffs = differences()
        if diffs:
            sys.exit(f"generated code differs from protos (run python protos/generate.py): {diffs}")
        print("services/v1 matches protos/")
    else:
        for path in generate(TARGET):
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
