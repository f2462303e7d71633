"""The docs name only files that exist: every repository path in backticks in README.md and docs/*.md.

A path is written from the repository's root, or, as the docs do for short, from the folder it lives in (the
package's modules as `store/claims.py` or `eros/store/claims.py`, a bench as `turn_overhead.py`, its results as
`turn_overhead.md`, a migration by its file name). Folders the tools create (`.venv`, `.data`, ...) are not the
repository's."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where a short path may start, besides the root.
HOMES = ["layers/eros", "layers/eros/eros", "layers/eros/eros/dreaming", "layers/eros/eros/migrations",
         "functions/chat", "devstack", "devstack/eros_dev", "bench", "bench/results", "tests", "console"]
CREATED = (".venv", ".data", ".artifacts", ".aws-sam", "exports/")  # made by make, the stack or the tests
SUFFIXES = (".py", ".md", ".sql", ".json", ".yaml", ".toml", ".txt", ".lock", ".png", ".js", ".html", ".css",
            ".jsonl")
CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _first_segment_is_ours(word: str) -> bool:
    """`docs/x.md`, `store/y.py`: a path into a folder of the repository (not a model name such as
    `anthropic/claude-haiku-4.5`, a metric `Eros/ExtractGaveUp` or a KMS alias `aws/secretsmanager`)."""
    first = word.split("/", 1)[0]
    return any((base / first).is_dir() for base in [ROOT, *(ROOT / home for home in HOMES)])


def candidates(text: str) -> set[str]:
    """The backticked words of a Markdown text that are file paths: no spaces, placeholders or routes, and a file
    suffix or a first folder of the repository. Fenced code blocks are commands, not references: skipped."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found = set()
    for word in CODE.findall(prose):
        word = word.strip()
        if re.search(r"[\s<>{}*…=?:$]", word) or word.startswith(("/", "-")) or word.startswith(CREATED):
            continue
        if word.endswith(SUFFIXES) or ("/" in word and _first_segment_is_ours(word)):
            found.add(word.rstrip("/"))
    return found


def exists(path: str) -> bool:
    return any((base / path).exists() for base in [ROOT, *(ROOT / home for home in HOMES)])


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_backticked_path_of_a_doc_exists(doc):
    missing = sorted(path for path in candidates(doc.read_text(encoding="utf-8")) if not exists(path))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_check_finds_paths_and_skips_routes_commands_and_placeholders():
    text = ("See `docs/DESIGN.md`, `store/claims.py` and `tests/nope.py`; not `/v1/memories/{id}`, "
            "`make test`, `functions/<name>/app.py`, `.data/exports`, `Eros/ExtractGaveUp` or `layer=profile`.\n"
            "```bash\ncat `docs/GONE.md`\n```\n")
    assert candidates(text) == {"docs/DESIGN.md", "store/claims.py", "tests/nope.py"}
    assert exists("docs/DESIGN.md") and exists("store/claims.py") and not exists("tests/nope.py")
