"""CHEATSHEET.md: at least 25 rows of symptom -> cause -> fix -> lesson, each linked to a section that exists."""
import json
import re
from urllib.parse import unquote

from conftest import ROOT

LINK = re.compile(r"\]\((notebooks/[\w.-]+\.ipynb)#([^)\s]+)\)")


def jupyterlab_anchor(heading: str) -> str:
    """The id JupyterLab gives a rendered heading: its text (code marks and emphasis gone), spaces as '-'."""
    return re.sub(r"[`*]", "", heading).strip().replace(" ", "-")


def anchors(notebook) -> set[str]:
    found = set()
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if match := re.match(r"^#{1,6} (.+)$", line):
                    found.add(jupyterlab_anchor(match.group(1)))
    return found


def rows() -> list[str]:
    lines = (ROOT / "CHEATSHEET.md").read_text().splitlines()
    return [line for line in lines if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line)][1:]  # no header


def test_at_least_25_rows_of_four_columns():
    table = rows()
    assert len(table) >= 25, f"CHEATSHEET.md has {len(table)} rows"
    for row in table:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
        assert len(cells) == 4 and all(cells), f"a row needs symptom | cause | fix | lesson: {row[:80]}"


def test_every_row_links_to_a_section_that_exists():
    for row in rows():
        links = LINK.findall(row)
        assert links, f"no lesson link in: {row[:80]}"
        for path, fragment in links:
            notebook = ROOT / path
            assert notebook.exists(), f"{path} does not exist"
            assert unquote(fragment) in anchors(notebook), f"{path} has no heading with anchor #{fragment}"


def test_the_anchor_is_jupyterlabs():
    assert jupyterlab_anchor(" 3. `map_location`: why every rank lands on GPU 0") == \
        "3.-map_location:-why-every-rank-lands-on-GPU-0"
