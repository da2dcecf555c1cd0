"""The front page and the docs pages hold together: every relative link in README.md and
docs/*.md names a file that exists, every ``#anchor`` (on the same page or another) a heading
that page has (GitHub's slugs), and the front page stays short."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRONT_PAGE_MAX_LINES = 300
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks (a ``# comment`` there is no heading)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the text as rendered (links by their text, no code
    marks), lowercased, every character but letters, digits, ``_``, ``-`` and spaces
    dropped, spaces → ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``; a repeated heading gets ``-1``, ``-2``, … as on
    GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(_prose(page.read_text())):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> Iterator[str]:
    """Every link target on ``page`` outside code (images included)."""
    for match in LINK.finditer(CODE_SPAN.sub("", _prose(page.read_text()))):
        yield match.group(1)


def _broken(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with ``page``'s relative links (files named relative to ``root``)."""
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page.resolve()
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.relative_to(root.resolve())} has no heading "
                          f"#{anchor}")
    return broken


def test_slugs_follow_github() -> None:
    assert slug("Tracking (MLflow)") == "tracking-mlflow"
    assert slug("Checking a GPU/NPU node") == "checking-a-gpunpu-node"
    assert slug("Exit criteria on a trained model (`make exit-gate`)") == \
        "exit-criteria-on-a-trained-model-make-exit-gate"
    assert slug("Validation loss by test-time loops (H_eff)") == \
        "validation-loss-by-test-time-loops-h_eff"
    assert slug("Data, workflow state and job logs") == "data-workflow-state-and-job-logs"
    assert slug("[Results](docs/results.md) × 2") == "results--2"


def test_repeated_headings_code_and_broken_links(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Top\n\n## Variants\n\n```yaml\n# not a heading\n```\n\n## Variants\n\n"
                    "[a](p.md#variants-1) [b](#top) `[c](nowhere.md)` [d](missing.md)\n"
                    "[e](p.md#nope) [f](#variants-2)\n```\n[g](also_nowhere.md)\n```\n"
                    "![h](gone.png) [i](https://example.org/x)\n")
    assert anchors(page) == {"top", "variants", "variants-1"}
    assert _broken(page, tmp_path) == ["missing.md: no such file",
                                       "p.md#nope: p.md has no heading #nope",
                                       "#variants-2: p.md has no heading #variants-2",
                                       "gone.png: no such file"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_exists(page: Path) -> None:
    broken = _broken(page)
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_front_page() -> None:
    front = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    unlinked = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))
                if p.resolve() not in front]
    assert not unlinked, "docs pages the front page does not link: " + ", ".join(unlinked)


def test_every_docs_page_links_back_to_the_front_page() -> None:
    readme = (ROOT / "README.md").resolve()
    lost = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))
            if readme not in {(p.parent / t.partition("#")[0]).resolve() for t in links(p)
                              if t.partition("#")[0]}]
    assert not lost, "docs pages without a link back to README.md: " + ", ".join(lost)


def test_front_page_is_short_and_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= FRONT_PAGE_MAX_LINES, (
        f"README.md has {len(text.splitlines())} lines; keep the front page at most "
        f"{FRONT_PAGE_MAX_LINES} and move detail to a docs/ page")
    assert "make demo" in text and "make test" in text
