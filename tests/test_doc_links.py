"""Every relative link and image in README.md and docs/ resolves, and the README stays a short front page.

Checked: inline links and images, ``[text](target)`` and ``![alt](target)``, and reference definitions,
``[label]: target``, outside fenced code blocks and inline code. Web and mail targets (``http://``,
``https://``, ``mailto:``) and a page's links to its own headings (``#anchor``) are not checked. A target is
resolved against the folder of the file that names it; a ``#fragment`` on a Markdown target must name one of
that file's headings, by GitHub's rule (lowercase; punctuation other than ``-`` and ``_`` dropped; spaces to
``-``; a repeated heading gets ``-1``, ``-2``, ...).

Links that leave the repository (``../shared/DESIGN.md``) are checked only where the folder they point into
sits beside the checkout, as it does in this project's workspace; a clone on its own does not have it.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)[\s\S]*?(?<!`)\1(?!`)")
# [text](target) or ![alt](target), with an optional "title"; the text may hold one level of brackets and wrap lines.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def blank_code(text: str) -> str:
    """The text with fenced code blocks and inline code replaced by spaces; line breaks (so line numbers) kept."""
    lines, fence = [], None
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            lines.append("\n")
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            lines.append("\n")
        else:
            lines.append(line)
    prose = "".join(lines)
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) for every link and image of a Markdown file, outside code."""
    prose = blank_code(path.read_text(encoding="utf-8"))
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEF):
        for m in pattern.finditer(prose):
            target = m.group(1).strip("<>").strip()
            if target:
                found.append((prose.count("\n", 0, m.start(1)) + 1, target))
    return sorted(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (inline markup is dropped with the punctuation)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in blank_code(path.read_text(encoding="utf-8")).splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def outside_checkout_missing(resolved: Path) -> bool:
    """True for a target outside the repository whose top folder is not beside the checkout."""
    try:
        resolved.relative_to(ROOT)
        return False
    except ValueError:
        pass
    try:
        first = resolved.relative_to(ROOT.parent).parts[0]
    except (ValueError, IndexError):
        return True
    return not (ROOT.parent / first).exists()


def broken_links() -> list[str]:
    problems = []
    anchor_cache: dict[Path, set[str]] = {}
    for path in doc_files():
        rel = path.relative_to(ROOT)
        for line, target in links(path):
            if target.startswith(EXTERNAL) or target.startswith("#"):
                continue
            file_part, _, fragment = target.partition("#")
            resolved = (path.parent / file_part).resolve()
            if outside_checkout_missing(resolved):
                continue
            if not resolved.exists():
                problems.append(f"{rel}:{line}: {target} (no such file: {file_part})")
                continue
            if fragment and resolved.suffix == ".md" and resolved.is_file():
                if resolved not in anchor_cache:
                    anchor_cache[resolved] = anchors(resolved)
                if fragment.lower() not in anchor_cache[resolved]:
                    problems.append(f"{rel}:{line}: {target} (no heading #{fragment} in {file_part})")
    return problems


def test_every_relative_link_resolves():
    problems = broken_links()
    assert not problems, f"{len(problems)} broken link(s) in README.md and docs/:\n" + "\n".join(problems)


def test_links_are_found():
    """The checker sees links at all: the README links to its docs pages, with and without fragments."""
    targets = {t for _, t in links(README)}
    assert "docs/modes.md" in targets and "docs/testing.md" in targets
    assert any("#" in t for p in doc_files() for _, t in links(p))


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < README_MAX_LINES, f"README.md has {n} lines; keep it under {README_MAX_LINES} and move detail to docs/"


def test_readme_quickstart_has_the_two_commands():
    text = README.read_text(encoding="utf-8")
    m = re.search(r"^## Quickstart\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, "README.md has no '## Quickstart' section"
    assert "make demo" in m.group(1) and "make test" in m.group(1), "README's Quickstart must show `make demo` and `make test`"


def test_slug_follows_github():
    # Worked by hand from GitHub's rendering of these headings.
    assert slug("Using a GPU lease") == "using-a-gpu-lease"
    assert slug("Attaching agents: `trinity-like serve`") == "attaching-agents-trinity-like-serve"
    assert slug("rollout/* (explorer, every step)") == "rollout-explorer-every-step"
    assert slug("train/*, trainer/*, replay/*") == "train-trainer-replay"
