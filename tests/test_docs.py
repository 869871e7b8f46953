"""The documentation keeps up with the code: its links land, and its map of the package
names every module there is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md"
                                   and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_the_package_map_names_every_module() -> None:
    text = (ROOT / "docs" / "pipeline.md").read_text()
    block = text[text.index("```\nssindex/\n"):]
    block = block[:block.index("\n```", 4)]
    package = ROOT / "ssindex"
    named = set(re.findall(r"[\w.]+", block))  # a top-level module goes by its stem
    missing = [str(f.relative_to(package)) for f in sorted(package.rglob("*"))
               if f.suffix in {".py", ".cpp"} and f.stem != "__init__"
               and f.name not in named and not (f.parent == package and f.stem in named)]
    assert not missing, f"docs/pipeline.md's package layout leaves out {missing}"
