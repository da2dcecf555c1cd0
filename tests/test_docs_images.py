"""Every picture under docs/ is shown somewhere (README.md or a docs/*.md page), and every
picture those pages show exists: a figure left behind by an old layout, or a link to one
that was never generated, fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".svg", ".gif"}
LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)|<img[^>]+src=\"([^\"]+)\"")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _linked() -> dict[Path, Path]:
    """Resolved image path → the page that links it (links relative to their page)."""
    out: dict[Path, Path] = {}
    for page in _pages():
        for match in LINK.finditer(page.read_text()):
            target = match.group(1) or match.group(2)
            if "://" in target:
                continue
            out[(page.parent / target.split("#")[0]).resolve()] = page
    return out


def test_every_linked_image_exists():
    missing = [f"{page.relative_to(ROOT)} → {path.relative_to(ROOT)}"
               for path, page in _linked().items() if not path.is_file()]
    assert not missing, "linked pictures that do not exist:\n" + "\n".join(missing)


def test_every_image_under_docs_is_linked():
    linked = set(_linked())
    unreferenced = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*"))
                    if p.suffix.lower() in IMAGE_SUFFIXES and p.resolve() not in linked]
    assert not unreferenced, ("pictures under docs/ that no page shows (remove them or link "
                              "them):\n" + "\n".join(unreferenced))
