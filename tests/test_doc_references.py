"""The repository stands alone: no reference to a document that is not in it.

Scans every text file of the repository (code, docs, README, examples, benchmarks, tests,
configuration) and fails on
- a reference to a ``.md`` file that does not exist in the repository (resolved against the
  citing file's folder, the repository root and ``docs/``),
- a ``file.md#anchor`` (or ``](#anchor)`` inside a Markdown file) whose heading does not exist
  (GitHub's heading anchors),
- the names of notes that live outside the repository, and paths that leave it.
Each failure lists ``path:line: reference``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml", ".json", ".sh"}
EXTRA_FILES = {".ci/run"}
SKIP_DIRS = {".git", ".stage", "build", "dist", "__pycache__", ".mypy_cache", ".pytest_cache",
             ".ruff_cache", ".venv", "venv", "node_modules", ".eggs", "shared"}

# Notes outside the repository (written in two pieces so that this file does not match itself).
FORBIDDEN = [re.compile(p) for p in (
    r"nki" r"-subset", r"msda" r"-design", r"torch" r"-integration", r"block" r"-attn-res\.md",
    r"\.\./" r"shared", r"shared" r"/docs")]

# Files that tools write (`> table.md`, `--out DIR` -> DIR/results.md): outputs, not references.
GENERATED_OUTPUTS = {"table.md", "results.md"}

MD_REF = re.compile(r"(?<![\w./-])((?:\.{1,2}/)*[\w][\w./-]*\.md)(#[\w.-]+)?(?![\w-])")
SAME_FILE_ANCHOR = re.compile(r"\]\((#[^)\s]+)\)")


def _repo_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        if path.is_file() and path != THIS and (path.suffix in TEXT_SUFFIXES
                                                 or rel.as_posix() in EXTRA_FILES):
            files.append(path)
    return sorted(files)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []


def _is_url(line: str, start: int) -> bool:
    """True when the match at ``start`` is part of a URL (https://..., github.com/...)."""
    word_start = max(line.rfind(c, 0, start) for c in " (<[`'\"\t") + 1
    word = line[word_start:start]
    return "://" in word or word.startswith(("www.", "github.com"))


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    in_code = False
    for line in _lines(md):
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = _slug(m.group(1))
            out.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return out


def _resolve(citing: Path, ref: str) -> Path | None:
    candidates = [citing.parent / ref, ROOT / ref]
    if "/" not in ref:
        candidates.append(ROOT / "docs" / ref)
    for c in candidates:
        c = c.resolve()
        if c.is_file() and ROOT in c.parents:
            return c
    return None


def _findings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"missing": [], "anchor": [], "forbidden": []}
    for path in _repo_files():
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(_lines(path), 1):
            where = f"{rel}:{n}"
            for pattern in FORBIDDEN:
                for m in pattern.finditer(line):
                    found["forbidden"].append(f"{where}: {m.group(0)}")
            refs = {(m.group(1), m.group(2)) for m in MD_REF.finditer(line)
                    if not _is_url(line, m.start())}  # `[a.md](a.md)` counts once
            for ref, anchor in sorted(refs, key=str):
                if ref in GENERATED_OUTPUTS or any(p.search(ref) for p in FORBIDDEN):
                    continue  # reported above
                target = _resolve(path, ref)
                if target is None:
                    found["missing"].append(f"{where}: {ref}")
                elif anchor and anchor[1:] not in anchors(target):
                    found["anchor"].append(f"{where}: {ref}{anchor}")
            if path.suffix == ".md":
                for m in SAME_FILE_ANCHOR.finditer(line):
                    if m.group(1)[1:] not in anchors(path):
                        found["anchor"].append(f"{where}: {m.group(1)}")
    return found


_FOUND = _findings()


@pytest.mark.parametrize("kind", ["missing", "anchor", "forbidden"])
def test_no_dangling_references(kind):
    what = {"missing": "references to .md files that are not in the repository",
            "anchor": "references to headings that do not exist",
            "forbidden": "references to notes outside the repository"}[kind]
    assert not _FOUND[kind], f"{len(_FOUND[kind])} {what}:\n" + "\n".join(_FOUND[kind])


def test_the_checker_finds_what_it_should(tmp_path):
    """The scanner itself: a missing file, a missing heading and a good reference."""
    assert _slug("B. Upstream `nkilib` design (facts)") == "b-upstream-nkilib-design-facts"
    assert _slug("Numerical range") == "numerical-range"
    md = tmp_path / "x.md"
    md.write_text("# Title\n## Same\n## Same\n```\n# not a heading\n```\n")
    assert anchors(md) == {"title", "same", "same-1"}
    line = "see docs/nowhere.md and README.md#no-such-heading, https://x.org/a.md"
    refs = [(m.group(1), m.group(2)) for m in MD_REF.finditer(line) if not _is_url(line, m.start())]
    assert refs == [("docs/nowhere.md", None), ("README.md", "#no-such-heading")]
    assert _resolve(ROOT / "tests" / "x.py", "docs/nowhere.md") is None
    assert _resolve(ROOT / "tests" / "x.py", "README.md") == (ROOT / "README.md").resolve()
