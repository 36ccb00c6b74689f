"""The notebook cell is the source: each `%%writefile ../ddp_scripts/X.py` cell equals the committed file."""
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, WRITES_DDP_COMMON, cell_that_writes, notebook_group

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def written_scripts() -> dict[str, tuple[Path, str]]:
    """script name -> (notebook, text the cell writes), for every %%writefile cell."""
    found = {}
    for notebook in NOTEBOOKS:
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.startswith("%%writefile"):
                first_line, _, body = source.partition("\n")
                target = Path(first_line.split(maxsplit=1)[1])
                assert target.parent in (Path("../ddp_scripts"), Path("../ddp_scripts/slurm")), \
                    f"{notebook.name} writes outside ddp_scripts: {target}"
                name = str(target.relative_to("../ddp_scripts"))
                assert name not in found, f"{name} is written by two cells"
                # %%writefile writes the cell body and ends it with a newline.
                found[name] = (notebook, body if body.endswith("\n") else body + "\n")
    return found


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks found"


# The lesson scripts, and the sbatch templates of lesson 10 (local_cluster.sh is a tool, not a lesson cell).
COMMITTED = sorted([p.name for p in SCRIPTS.glob("*.py")] + [f"slurm/{p.name}" for p in SCRIPTS.glob("slurm/*.sbatch")])


@pytest.mark.parametrize("name", COMMITTED)
def test_every_script_is_written_by_a_notebook_cell(name):
    cells = written_scripts()
    assert name in cells, f"ddp_scripts/{name} is committed but no notebook cell writes it"
    notebook, text = cells[name]
    committed = (SCRIPTS / name).read_text()
    assert committed == text, (
        f"ddp_scripts/{name} differs from its %%writefile cell in {notebook.name}: "
        "edit the notebook cell, run it, and commit both")


def test_every_written_script_is_committed():
    missing = [name for name in written_scripts() if not (SCRIPTS / name).exists()]
    assert missing == [], f"notebook cells write scripts that are not committed: {missing}"


def scripts_a_notebook_uses(notebook: Path) -> set[str]:
    """The ddp_scripts/ modules a notebook names or imports into its kernel, and what those import in turn."""
    code = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code")
    todo = re.findall(r"ddp_scripts/(\w+)\.py", code)
    if '"../ddp_scripts"' in code:  # sys.path.insert(0, "../ddp_scripts"): its imports are scripts too
        todo += re.findall(r"^\s*(?:from|import) (\w+)", code, re.M)
    used = set()
    while todo:
        name = todo.pop()
        if name not in used and (SCRIPTS / f"{name}.py").exists():
            used.add(name)
            todo += re.findall(r"^(?:from|import) (\w+)", (SCRIPTS / f"{name}.py").read_text(), re.M)
    return used


def test_the_second_group_of_notebooks_shares_only_ddp_common_with_the_first():
    """Under `pytest -n 2` the two groups run side by side (tests/conftest.py): neither may launch a script while
    the other's %%writefile cell rewrites it. The second group waits for lesson 00, which writes ddp_common.py."""
    writer = {Path(name).stem: notebook for name, (notebook, _) in written_scripts().items()}
    second = {nb for nb in NOTEBOOKS if notebook_group(f"notebooks/{nb.name}") == "notebooks, second group"}
    assert second and second != set(NOTEBOOKS)
    for notebook in NOTEBOOKS:
        crossing = {script for script in scripts_a_notebook_uses(notebook)
                    if (writer[script] in second) != (notebook in second)}
        assert crossing <= ({"ddp_common"} if notebook in second else set()), \
            f"{notebook.name} uses {sorted(crossing)}, written by the other group: move it to that group"
    assert writer["ddp_common"] == ROOT / WRITES_DDP_COMMON
    # The second group starts when that cell is done. xdist runs a cell once it has sent the next one, so a cell
    # must follow it in lesson 00 (the lesson may run alone beside the second group).
    code_cells = sum(c["cell_type"] == "code" for c in json.loads((ROOT / WRITES_DDP_COMMON).read_text())["cells"])
    assert cell_that_writes(WRITES_DDP_COMMON, "ddp_common.py") != f"{WRITES_DDP_COMMON}::Cell {code_cells - 1}"
