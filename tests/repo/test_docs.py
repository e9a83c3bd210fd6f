"""The README is what a newcomer reads first (issue 30): short (what it is, install, the two commands, a few
snippets, where to go next), with the manual in docs/. Every docs page is reachable from the README, and no
relative link in either points at a file or heading that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 160  # it was 916 lines, the Python API starting at line 725
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as dashes."""
    return {re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in page.read_text().splitlines() if line.startswith("#")}


def test_readme_is_short_and_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "keep the README short: move the detail into docs/"
    assert DOCS, "docs/ holds the manual"
    linked = {target for target in LINK.findall(readme)}
    assert {f"docs/{page.name}" for page in DOCS} <= linked, "every docs/ page is linked from the README"


def test_relative_links_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", *DOCS]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
