"""The docs' cross-references resolve: relative links and their #anchors, `docs/X.md, "Section"`
references, and eval reports (every docs/eval report is quoted by a page as `docs/eval/NAME.json`,
and every such name a page quotes exists)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
SECTION_REF = re.compile(r"(docs/[\w.-]+\.md),? \"([^\"]+)\"")
REPORT_REF = re.compile(r"docs/eval/([\w.-]+\.json)")


def _headings(page):
    """GitHub's anchors and the plain heading texts of a markdown page (code blocks skipped)."""
    anchors, texts, seen, fenced = set(), [], {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().replace("`", "")
        texts.append(text.lower())
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors, texts


def _prose(page):
    """The page's text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page):
    bad = []
    for m in LINK.finditer(_prose(page)):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _headings(dest)[0]:
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, f"{page.name}: " + "; ".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_section_references_name_a_heading(page):
    bad = []
    for m in SECTION_REF.finditer(" ".join(_prose(page).split())):
        dest, section = ROOT / m.group(1), m.group(2).replace("`", "").lower()
        if not dest.exists():
            bad.append(f"{m.group(1)}: no such page")
        elif not any(t.startswith(section) for t in _headings(dest)[1]):
            bad.append(f'{m.group(1)}, "{m.group(2)}": no such heading')
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_every_eval_report_is_quoted_and_every_quoted_report_exists():
    quoted = {name for page in PAGES for name in REPORT_REF.findall(page.read_text())}
    reports = {p.name for p in (ROOT / "docs" / "eval").glob("*.json")}
    assert not reports - quoted, f"reports no page quotes as docs/eval/NAME: {sorted(reports - quoted)}"
    assert not quoted - reports, f"pages quote missing reports: {sorted(quoted - reports)}"
