"""`apexrl tables`: the `[[replay.tables]]` of a config file, made from its algorithm's settings.

An algorithm's table settings (`capacity`, `priority_exponent`, ...) live in its `[<algorithm>]`
table (algorithms/tables.py); its builder turns them and the env's columns into the replay's
tables. Local mode writes them into its run folder's config; a config file that runs the replay
on its own (Kubernetes' ConfigMap, the kustomize overlays) carries them in a block this command
writes after a marker line, so they are generated from the one source, never copied by hand:

    apexrl tables --config deploy/kustomize/overlays/ppo/apexrl.toml           # prints them
    apexrl tables --config deploy/kustomize/overlays/ppo/apexrl.toml --write   # rewrites the block

A `.yaml` file is read as a ConfigMap whose `apexrl.toml` key holds the config (deploy/k8s).
Torch-free: the builders declare their tables without it.
"""

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from apexrl import config as cfg
from apexrl.config import RATIO_ONLY, ReplayTableConfig, TableFields

MARKER = "# [[replay.tables]]: generated from the algorithm's settings by `apexrl tables --write`"
CONFIG_KEY = "apexrl.toml"


def entry(table: ReplayTableConfig) -> dict:
    """A table as a `[[replay.tables]]` entry: its name first, no ratio settings on a queue, no
    priority exponent where priorities are not sampled."""
    keys = ["name"] + [f.name for f in dataclasses.fields(TableFields)]
    if table.rate_limiter == "queue":
        keys = [k for k in keys if k not in RATIO_ONLY]
    if table.sampler != "prioritized":
        keys.remove("alpha")
    return {key: getattr(table, key) for key in keys}


def render(tables: list[ReplayTableConfig]) -> list[str]:
    """The tables as TOML lines, one `[[replay.tables]]` each, a blank line between them."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, int) and v >= 10_000:
            return f"{v:_}"
        return repr(v)

    lines: list[str] = []
    for table in tables:
        lines += ["[[replay.tables]]", *(f"{k} = {value(v)}" for k, v in entry(table).items())]
        lines.append("")
    return lines[:-1]


def config_text(path: Path) -> str:
    """The TOML config a file holds (a ConfigMap's `apexrl.toml` for a .yaml file)."""
    text = path.read_text()
    if path.suffix not in (".yaml", ".yml"):
        return text
    import yaml  # a tool for the repository's manifests: PyYAML comes with the test extra

    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and CONFIG_KEY in (doc.get("data") or {}):
            return doc["data"][CONFIG_KEY]
    raise ValueError(f"{path}: no ConfigMap with an {CONFIG_KEY} key")


def declared_tables(path: Path, argv: list[str]) -> list[ReplayTableConfig]:
    """The tables the config file's algorithm declares for its env (flags in argv over it)."""
    from apexrl import algorithms

    def parse(toml: Path):
        flags = ["--config", str(toml), *argv]
        return cfg.parse(cfg.AgentConfig, flags, "tables", "apexrl tables", algorithms.REGISTRY)

    if path.suffix not in (".yaml", ".yml"):
        return algorithms.make(parse(path)).tables()
    with tempfile.TemporaryDirectory() as folder:  # errors name it: FILE.yaml[apexrl.toml]
        toml = Path(folder) / f"{path.name}[{CONFIG_KEY}]"
        toml.write_text(config_text(path))
        return algorithms.make(parse(toml)).tables()


def with_block(text: str, lines: list[str], path: Path) -> str:
    """text with the block after its MARKER line replaced by `lines` (at the marker's indent):
    the block is the `[[replay.tables]]` entries and blank lines that follow the marker."""
    rows = text.split("\n")
    at = [i for i, row in enumerate(rows) if row.strip() == MARKER]
    if len(at) != 1:
        raise ValueError(
            f"{path}: needs the line {MARKER!r} once, where the tables go ({len(at)} found)"
        )
    indent = rows[at[0]][: len(rows[at[0]]) - len(rows[at[0]].lstrip())]
    end = at[0] + 1
    while end < len(rows) and _in_block(rows[end], indent):
        end += 1
    while end > at[0] + 1 and not rows[end - 1].strip():
        end -= 1  # the blank lines before the next table stay
    block = [indent + line if line else "" for line in lines]
    return "\n".join(rows[: at[0] + 1] + block + rows[end:])


def _in_block(row: str, indent: str) -> bool:
    if not row.strip():
        return True
    if not row.startswith(indent) or row[len(indent)] in " \t":
        return False  # another YAML key, or deeper than the TOML
    body = row[len(indent) :]
    return body.startswith("[[replay.tables]]") or not body.startswith(("[", "#"))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="apexrl tables", description=__doc__.split("\n\n")[0], add_help=False
    )
    parser.add_argument("--config", required=True, help="the config file (TOML, or a ConfigMap)")
    parser.add_argument("--write", action="store_true", help="rewrite the file's generated block")
    parser.add_argument("-h", "--help", action="help")
    args, rest = parser.parse_known_args(argv)
    path = Path(args.config)
    try:
        lines = render(declared_tables(path, rest))
        if args.write:
            path.write_text(with_block(path.read_text(), lines, path))
            return
    except (OSError, ValueError) as err:
        print(f"apexrl tables: error: {err}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(lines))
