"""The docs a newcomer reads: a README that is a map, links that resolve, and no text that
narrates how the project was worked on (stop or run numbers, who was editing, one machine's
scratch paths) in the docs or in the comments and docstrings of the code."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_MAX_LINES = 250
RESULTS = REPO / "docs" / "benchmarks.md"
RESULTS_MAX_LINES = 500

# Markdown the checks read: the README, docs/, and the READMEs beside the code.
MARKDOWN = sorted(
    [README, *(REPO / "docs").rglob("*.md"), *(REPO / "benchmarks").rglob("*.md")]
    + list((REPO / "deploy").rglob("*.md"))
)
# Code whose comments and docstrings are read: Python under these folders (generated code
# excepted), and the comments of deploy/'s manifests, configs, Dockerfiles and scripts.
CODE_DIRS = ("services", "benchmarks", "deploy")
GENERATED = REPO / "services" / "v1"
HASH_COMMENTED = (".yaml", ".yml", ".toml", ".sh")
HASH_COMMENTED_NAMES = ("Dockerfile", "Dockerfile.dockerignore", "Kustomization")

NARRATION = re.compile(
    "|".join(
        [
            r"\bstops? \d+",  # a work stop by number: "stop 21", "stops 20-22"
            r"/tmp/",  # one machine's scratch path
            r"\b(?:this|that|the same|same|one) session\b",
            r"\ba helper's\b",
            # A run by number, as a label ("run 7,", "run 6 (...)", "run 7's seeds", "runs 1-3:"),
            # not a count ("the test runs 1 actor, then 3").
            r"\bruns? \d+(?:[-–]\d+)?"
            r"(?=['’]s\b|\s*[,;:()]|\.(?:\s|$)|\s*$|\s+(?:above|below|before|after|of)\b)",
        ]
    ),
    re.IGNORECASE,
)


def narration(text: str) -> list[str]:
    """The narrating phrases in text, line by line."""
    return [m.group(0) for line in text.splitlines() for m in NARRATION.finditer(line)]


def python_prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment (tokenize) and docstring (ast) in Python source; string
    literals the code uses (a path, a message) are not prose and are left out."""
    prose = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            prose.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    prose.append((body[0].lineno, body[0].value.value))
    return sorted(prose)


def hash_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of the `#` comments of a YAML, TOML, shell or Dockerfile text (a `#` at the
    start of a line or after whitespace; YAML block scalars holding TOML included)."""
    comments = []
    for number, line in enumerate(text.splitlines(), 1):
        match = re.search(r"(?:^|\s)(#.*)$", line)
        if match:
            comments.append((number, match.group(1)))
    return comments


def findings(path: Path) -> list[str]:
    """`path:line: phrase` for each narrating phrase in the file's docs, comments or docstrings."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        prose = list(enumerate(text.splitlines(), 1))
    elif path.suffix == ".py":
        prose = python_prose(text)
    else:
        prose = hash_comments(text)
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return [
        f"{where}:{number + offset}: {phrase!r}"
        for number, chunk in prose
        for offset, line in enumerate(chunk.splitlines())
        for phrase in narration(line)
    ]


def code_files() -> list[Path]:
    files = []
    for folder in CODE_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.is_relative_to(GENERATED):
                continue
            if path.suffix == ".py" or path.suffix in HASH_COMMENTED:
                files.append(path)
            elif path.name in HASH_COMMENTED_NAMES:
                files.append(path)
    return files


def test_results_page_is_short():
    lines = RESULTS.read_text(encoding="utf-8").count("\n")
    assert lines <= RESULTS_MAX_LINES, (
        f"docs/benchmarks.md has {lines} lines, at most {RESULTS_MAX_LINES}: it holds the "
        "current figures, each with its command; how they were reached goes to docs/experiments/"
    )


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, at most {README_MAX_LINES}: the README is a map, "
        "docs/ holds the detail"
    )


def markdown_links(text: str) -> list[str]:
    """Link and image targets of Markdown text, outside code blocks and inline code."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    slugs = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def broken_links(doc: Path) -> list[str]:
    """The relative links and images of a Markdown file whose file, or heading, is missing."""
    broken = []
    for target in markdown_links(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target} (no heading #{fragment} in {linked.name})")
    return broken


@pytest.mark.parametrize(
    "doc", [README, *sorted((REPO / "docs").rglob("*.md"))], ids=lambda p: p.name
)
def test_relative_links_resolve(doc: Path):
    assert not broken_links(doc), f"{doc.relative_to(REPO)}: broken links: {broken_links(doc)}"


def test_link_check_finds_broken_links(tmp_path: Path):
    (tmp_path / "there.md").write_text("# There\n\n## A heading: with `code`\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](there.md#a-heading-with-code), [web](https://example.org/x.md),\n"
        "[gone](missing.md), ![gone too](img/missing.png), [bad anchor](there.md#nowhere),\n"
        "`[in code](missing-in-code.md)`\n"
        "```\n[in a block](missing-in-block.md)\n```\n"
    )
    assert broken_links(doc) == [
        "missing.md (no such file)",
        "img/missing.png (no such file)",
        "there.md#nowhere (no heading #nowhere in there.md)",
    ]


def test_readme_gives_the_two_commands():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Two commands") :]
    section = section[: section.index("\n## ")]
    assert re.search(r"^make run\b", section, flags=re.MULTILINE), "README: `make run` is missing"
    assert re.search(r"^make test\b", section, flags=re.MULTILINE), "README: `make test` is missing"


def test_docs_do_not_narrate():
    found = [line for path in MARKDOWN for line in findings(path)]
    assert not found, "narration in the docs:\n" + "\n".join(found)


def test_comments_and_docstrings_do_not_narrate():
    found = [line for path in code_files() for line in findings(path)]
    assert not found, "narration in comments or docstrings:\n" + "\n".join(found)


def test_checker_finds_planted_phrases(tmp_path: Path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Module docstring: figures of run 7, below."""\n'
        "SCRATCH = '/tmp/kept: a string the code uses, not prose'\n"
        "\n"
        "\n"
        "def f():\n"
        '    """Timed in this session."""\n'
        "    return 1  # measured in stop 21\n"
    )
    assert findings(planted) == [
        f"{planted}:1: 'run 7'",
        f"{planted}:6: 'this session'",
        f"{planted}:7: 'stop 21'",
    ]
    manifest = tmp_path / "config.yaml"
    manifest.write_text("a: 1  # sized in /tmp/scratch\nb: '/tmp/x'\n")
    assert findings(manifest) == [f"{manifest}:1: '/tmp/'"]
    doc = tmp_path / "doc.md"
    doc.write_text("Median 1.3 s (runs 1-3: 1.2, 1.4), a helper's edits beside it.\n")
    assert findings(doc) == [f"{doc}:1: 'runs 1-3'", f'{doc}:1: "a helper\'s"']


@pytest.mark.parametrize(
    "text",
    [
        "the test runs 1 actor, then 3, where the manifest has 4",
        "each process runs 2 threads",
        "a run 60 s long",
        "stop accepting, finish in-flight work, then stop",
        "SIGTERM stops the 4 actors",
        "/tmp is the pod's one writable path (an emptyDir)",
    ],
)
def test_checker_leaves_plain_prose_alone(text: str):
    assert narration(text) == []
