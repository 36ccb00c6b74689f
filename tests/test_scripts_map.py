"""ddp_scripts/README.md, the map from script to lesson: every file once, under the lesson that writes it, with a
command that runs that file and no other."""
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT

# The repository's ddp_scripts/, not conftest's SCRIPTS: under xdist that is a snapshot in a temporary directory, from
# which the README's links to ../notebooks/ lead nowhere. Only names are read here, never a script being rewritten.
SCRIPTS = ROOT / "ddp_scripts"
README = SCRIPTS / "README.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
NOTEBOOK_LINK = re.compile(r"\]\(\.\./notebooks/([\w.-]+\.ipynb)\)")
CODE = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"^(\w+=\S+ )*(python|torchrun|sbatch|sudo)\b")  # a command line, after its environment
COMMAND_PATH = re.compile(r"ddp_scripts/([\w./-]+)")
# The lesson scripts, and everything in slurm/ (the sbatch templates, and local_cluster.sh, a tool no notebook writes).
FILES = sorted([p.name for p in SCRIPTS.glob("*.py")]
               + [f"slurm/{p.name}" for p in SCRIPTS.glob("slurm/*") if p.is_file()])


def file_links() -> list[str]:
    """Every link in the README to a file in ddp_scripts/, as a path inside ddp_scripts/, in order."""
    return [link for link in LINK.findall(README.read_text()) if not link.startswith(("../", "http"))]


def sections() -> dict[str, str]:
    """notebook file name -> the text of the `## ` section whose heading links it."""
    found = {}
    for section in re.split(r"^(?=## )", README.read_text(), flags=re.M):
        heading = section.partition("\n")[0]
        if match := NOTEBOOK_LINK.search(heading):
            assert match.group(1) not in found, f"two sections of ddp_scripts/README.md link {match.group(1)}"
            found[match.group(1)] = section
    return found


def rows() -> list[tuple[str, list[str]]]:
    """(the file a table row links, the row's cells), for every row of every table."""
    found = []
    for line in README.read_text().splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if links := LINK.findall(cells[0]):  # the header has none
                found.append((links[0], cells))
    return found


def writers() -> dict[str, Path]:
    """ddp_scripts/ file name (slurm/X for the templates) -> the notebook whose %%writefile cell writes it."""
    found = {}
    for notebook in NOTEBOOKS:
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.startswith("%%writefile ../ddp_scripts/"):
                found[source.partition("\n")[0].removeprefix("%%writefile ../ddp_scripts/").strip()] = notebook
    return found


@pytest.mark.parametrize("name", FILES)
def test_every_file_has_one_row(name):
    count = file_links().count(name)
    assert count == 1, f"ddp_scripts/{name} is linked {count} times in ddp_scripts/README.md: " + (
        "add a row to ddp_scripts/README.md, under the lesson that writes it" if count == 0 else "keep one row")


def test_every_link_points_at_a_file_that_exists():
    links = LINK.findall(README.read_text())
    assert len(links) >= len(FILES)
    missing = [link for link in links if not (README.parent / link).is_file()]
    assert missing == [], f"ddp_scripts/README.md links files that do not exist: {missing}"


def test_every_script_is_listed_under_the_notebook_that_writes_it():
    by_notebook = sections()
    assert set(by_notebook) == {nb.name for nb in NOTEBOOKS}, "ddp_scripts/README.md needs one section per lesson"
    for name, notebook in writers().items():
        assert f"]({name})" in by_notebook[notebook.name], (
            f"{notebook.name} writes ddp_scripts/{name}: add a row to ddp_scripts/README.md under its heading")


def test_the_sections_follow_the_course_order():
    assert list(sections()) == [nb.name for nb in NOTEBOOKS]


def test_every_command_runs_the_script_of_its_row():
    table = rows()
    assert len(table) == len(FILES), "one table row per file (test_every_file_has_one_row says which)"
    for name, cells in table:
        assert len(cells) == 3 and all(cells), f"a row needs script | what it shows | run it: {name}"
        commands = [code for code in CODE.findall(cells[2]) if COMMAND.match(code) or "ddp_scripts/" in code]
        assert commands or "imported by" in cells[2], f"the row of {name} needs a command, or whom it is imported by"
        for command in commands:
            assert COMMAND_PATH.findall(command) == [name], f"the row of {name} runs another file: {command}"


def test_a_command_is_read_with_its_environment_and_whole_path():
    command = "TORCH_LOGS=graph_breaks torchrun --standalone --nproc-per-node=2 ddp_scripts/slurm/x.sbatch --a"
    assert COMMAND.match(command) and COMMAND_PATH.findall(command) == ["slurm/x.sbatch"]
    assert COMMAND_PATH.findall("python -m lessons doctor $REPO/ddp_scripts/three_mistakes.py -n 2") == [
        "three_mistakes.py"]
    assert not COMMAND.match("ddp_from_scratch.py")  # "imported by `ddp_from_scratch.py`" names no command


# A script that makes a process group imports ddp_common before it, for a clean exit (without it about 1 gloo launch
# in 10 died at exit with SIGABRT; lesson 15's layouts.py did in make test). These do without it, on purpose: the
# template carries its own fix; the doctor's subjects are written as a learner's script would be; the others are
# the shortest form of what a lesson shows, each launched in one cell that has not failed so (init_methods.py's
# ranks are forked and end with os._exit: no interpreter teardown).
STANDALONE = {"template.py", "three_mistakes.py", "three_mistakes_fixed.py", "separate_models.py", "summed_loss.py",
              "local_rank_mistakes.py", "init_minimal.py", "launch_spawn.py", "multinode_mistakes.py",
              "init_methods.py"}


def test_every_script_that_makes_a_process_group_imports_ddp_common():
    scripts = sorted(p for p in (ROOT / "ddp_scripts").glob("*.py")
                     if re.search(r"init_process_group\(|init_device_mesh\(", p.read_text()))
    assert len(scripts) > 20, scripts  # the search finds the lessons' scripts
    missing = [p.name for p in scripts if p.name not in STANDALONE and "import ddp_common" not in p.read_text()
               and "from ddp_common import" not in p.read_text()]
    assert missing == [], f"import ddp_common before init_process_group in: {missing}"
