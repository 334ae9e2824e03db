"""Every relative link in the project's Markdown resolves: the file or directory exists in the
repository, and a ``#fragment`` names a heading of the target page as GitHub renders it. The
README points into docs/ for everything it no longer says itself, so a moved or renamed
section must not leave a dead link behind."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from helpers.exporter_proc import REPO

#: directories that are not the project's documents (tools, builds, virtualenvs)
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", ".mypy_cache"}
#: the pages a user starts from: they must exist, whatever else the glob finds
ENTRY_PAGES = ("README.md", "docs/README.md", "tests/README.md")

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
#: [text](target "title") and ![alt](target); the target may be <bracketed>
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def markdown_files() -> list[Path]:
    found = []
    for path in sorted(REPO.rglob("*.md")):
        rel = path.relative_to(REPO)
        if path.is_symlink():
            continue  # a copy of a page checked where it lives (the packaged runbook)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        found.append(path)
    return found


def prose_lines(text: str, *, blank_code: bool = True) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with code spans blanked out unless
    ``blank_code`` is false."""
    out = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None and blank_code:
            out.append((number, _CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)))
        elif fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, with everything
    but letters, digits, ``_``, ``-`` and spaces removed and spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LMN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found = set(_HTML_ANCHOR.findall(text))
    for _, line in prose_lines(text, blank_code=False):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the page's prose."""
    text = path.read_text(encoding="utf-8")
    out = []
    for number, line in prose_lines(text):
        targets = [m.group(1) for m in _INLINE.finditer(line)]
        ref = _REFERENCE.match(line)
        if ref:
            targets.append(ref.group(1))
        out += [(number, t[1:-1] if t.startswith("<") else t) for t in targets]
    return out


def problem(source: Path, target: str) -> str | None:
    """Why a link target of ``source`` does not resolve, or None (external links are not
    followed)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return None  # http:, https:, mailto:
    file_part, _, fragment = target.partition("#")
    dest = source if not file_part else (source.parent / unquote(file_part)).resolve()
    if not dest.is_relative_to(REPO.resolve()):
        return f"{target}: outside the repository"
    if not dest.exists():
        return f"{target}: {dest.relative_to(REPO.resolve())} does not exist"
    if fragment and dest.suffix == ".md" and unquote(fragment) not in anchors(dest):
        return f"{target}: no heading #{fragment} in {dest.relative_to(REPO.resolve())}"
    return None


def test_entry_pages_exist() -> None:
    for page in ENTRY_PAGES:
        assert (REPO / page).is_file(), page
    assert set(ENTRY_PAGES) <= {str(p.relative_to(REPO)) for p in markdown_files()}


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = [
        f"{page.relative_to(REPO)}:{number}: {why}"
        for number, target in links(page)
        if (why := problem(page, target)) is not None
    ]
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_in_the_index() -> None:
    """docs/README.md is the index: a page in docs/ that it does not link is a page nobody
    finds."""
    index = REPO / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)}
    missing = [
        p.name for p in sorted((REPO / "docs").glob("*.md")) if p != index and p not in linked
    ]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Runs (collector `runs`)", "runs-collector-runs"),
        ("TLS and basic auth: `--web.config.file`", "tls-and-basic-auth---webconfigfile"),
        ("Per framework: what to put in the config", "per-framework-what-to-put-in-the-config"),
        (
            "With the Hugging Face Trainer, Lightning or torchrun",
            "with-the-hugging-face-trainer-lightning-or-torchrun",
        ),
        ("Written by trainguard: `save_dir`", "written-by-trainguard-save_dir"),
    ],
)
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    """Headings of these pages and the anchors GitHub's rule gives them (lower case; every
    punctuation mark but ``-`` and ``_`` dropped, the spaces around it kept as ``-``)."""
    assert slug(heading) == anchor


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing heading and a link in code that is not a
    link."""
    page = REPO / "docs" / "README.md"
    assert problem(page, "metrics.md") is None
    assert problem(page, "no-such-page.md") is not None
    assert problem(page, "metrics.md#no-such-heading") is not None
    assert problem(page, "../README.md#quickstart-the-first-ten-minutes") is None
    assert problem(page, "https://example.com/x.md") is None
    doc = tmp_path / "x.md"
    doc.write_text("`[a](missing.md)`\n\n```\n[b](missing.md)\n```\n[c](there.md)\n")
    assert [t for _, t in links(doc)] == ["there.md"]
