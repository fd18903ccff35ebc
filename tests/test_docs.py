"""The documentation's relative links resolve: files exist, and a `#fragment` names a heading of its page."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "tests" / "README.md",
    ROOT / "containers" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "measurements").glob("*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces to dashes (fenced code skipped)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#{1,6} (.+)$", text, re.M)
    }


def relative_links(page: Path):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in relative_links(page):
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [gone](missing.md) [bad](#nowhere)\n```\n[code](x.md)\n```\n")
    assert relative_links(page) == ["#top", "missing.md", "#nowhere"]
    assert anchors(page) == {"top"}


def test_the_readme_is_a_newcomers_five_minutes():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    assert any("make demo" in line for line in lines[:40])


def test_the_performance_page_is_a_users_ten_minutes():
    """docs/performance.md keeps the current figures; how they were found goes to docs/measurements/."""
    lines = (ROOT / "docs" / "performance.md").read_text().splitlines()
    assert len(lines) < 300, len(lines)


def test_the_model_table_gives_each_familys_floor_as_the_code_has_it():
    """docs/models.md's transformers column is model.FAMILIES, row for row ("any" where every supported release
    has the family's class), and every floor there is one that setup.cfg's own transformers floor does not meet."""
    import configparser

    from packaging.requirements import Requirement
    from packaging.version import Version

    from bert_squad.model import FAMILIES

    rows = {}
    for line in (ROOT / "docs" / "models.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5:
            rows[cells[0]] = cells[3]
    table = {f.name: f"{f.since or 'any'} (`{f.loads}`)" for f in FAMILIES}
    assert table == {f.name: rows.get(f.name) for f in FAMILIES}
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    requirements = map(Requirement, setup["options"]["install_requires"].strip().splitlines())
    (oldest,) = [Version(s.version) for r in requirements if r.name == "transformers" for s in r.specifier]
    reachable = [f"{f.name} {f.since}" for f in FAMILIES if f.since and Version(f.since) > oldest]
    assert reachable == [f"{f.name} {f.since}" for f in FAMILIES if f.since], f"floors at or below {oldest}"
