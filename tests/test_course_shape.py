"""The shape of every lesson: it ends with "What to remember" (3-6 bullets), then "Next", which names the next
notebook on each track the lesson is on; and lesson 00 stays a short first contact."""
import json
import re

import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# The two tracks (README.md).
FAST = ["00_start_here", "04_ddp_training", "05_distributed_sampler", "07_checkpoints", "11_debugging",
        "14_your_own_script", "14b_the_ddp_doctor", "13_training_loop", "13b_stopping_lr_and_compile"]
FULL = sorted(nb.stem for nb in NOTEBOOKS if not nb.stem.startswith("99_")) + ["99_appendix_under_the_hood"]
COURSE = set(FULL)


def cells(notebook):
    return json.loads(notebook.read_text())["cells"]


def text(cell) -> str:
    return "".join(cell["source"])


def next_on(track: list[str], name: str) -> str | None:
    return track[track.index(name) + 1] if name in track[:-1] else None


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_ends_with_what_to_remember_then_next(notebook):
    *_, remember, last = cells(notebook)
    assert last["cell_type"] == "markdown" and text(last).startswith("## Next\n"), \
        f"{notebook.name}: the last cell must be a markdown cell starting '## Next'"
    assert remember["cell_type"] == "markdown" and text(remember).startswith("## What to remember\n"), \
        f"{notebook.name}: the cell before '## Next' must be '## What to remember'"
    bullets = [line for line in text(remember).splitlines() if re.match(r"^[-*] ", line)]
    assert 3 <= len(bullets) <= 6, f"{notebook.name}: 'What to remember' has {len(bullets)} bullets, not 3 to 6"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_next_names_the_next_lesson_of_each_track(notebook):
    last = text(cells(notebook)[-1])
    linked = re.findall(r"\]\(([\w.-]+)\.ipynb\)", last)
    assert set(linked) <= COURSE, f"{notebook.name}: Next links to notebooks outside the course: {set(linked) - COURSE}"
    for label, track in (("Fast track", FAST), ("Full track", FULL)):
        expected = next_on(track, notebook.stem)
        if expected:
            assert re.search(rf"\*\*{label}:?\*\*:?[^\n]*\[{expected}\]\({expected}\.ipynb\)", last), \
                f"{notebook.name}: Next must say **{label}:** [{expected}]({expected}.ipynb)"


def test_the_first_notebook_is_short_and_launches_ddp_early():
    """Issue 24: under 15 KB of source; the 2-rank launch and its check against one process come early."""
    first = cells(ROOT / "notebooks" / "00_start_here.ipynb")
    sources = [text(c) for c in first]
    assert sum(len(s.encode()) for s in sources) < 15_000
    launch = next(i for i, s in enumerate(sources) if 'lessons.torchrun("../ddp_scripts/digits_ddp.py", nproc=2' in s)
    check = next(i for i, s in enumerate(sources) if "max_weight_difference" in s)
    assert launch < check < len(first) * 2 // 3


def test_no_nbval_comment_in_any_notebook():
    """nbval's markers are cell tags, out of the learner's sight (issue 25), never `# NBVAL_*` comments."""
    carrying = [f"{nb.name} cell {i}" for nb in NOTEBOOKS for i, c in enumerate(cells(nb))
                if c["cell_type"] == "code" and re.search(r"^\s*#\s*NBVAL_", text(c), re.M)]
    assert carrying == []


# One lesson, one sitting: at most 25 KB of source (markdown and code, outputs excluded).
SOURCE_LIMIT = 25_000


def test_each_lesson_fits_one_sitting(capsys):
    sizes = {nb.stem: sum(len(text(c).encode()) for c in cells(nb)) for nb in NOTEBOOKS}
    with capsys.disabled():
        print("\nnotebook source sizes (KB):", ", ".join(f"{name.split('_')[0]} {size / 1000:.1f}" for name, size in sizes.items()))
    over = {name: size for name, size in sizes.items() if size > SOURCE_LIMIT}
    assert over == {}, f"over {SOURCE_LIMIT // 1000} KB of source: {over}"


def test_the_readme_states_the_tracks_and_the_hours_that_benchmarks_course_time_counts():
    """The README's fast track is FAST, in order, as in course_time.py; its hours are what that script counts (a
    lesson that grows changes them: run it, and update the README)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_time", ROOT / "benchmarks" / "course_time.py")
    course_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course_time)
    assert course_time.FAST == FAST
    readme = (ROOT / "README.md").read_text()
    fast_line = readme[readme.index("- **Fast track**"):readme.index("- **Full track**")]
    assert re.findall(r"`(\d\d\w?_\w+)`", fast_line) == FAST

    per_lesson = {notebook.stem: course_time.minutes(notebook) for notebook in NOTEBOOKS}

    def spoken(names, with_exercises=True):  # to the nearest half hour, as the README writes it
        half_hours = round(course_time.hours(per_lesson, names, with_exercises) * 2)
        return f"{half_hours // 2}" + ("½" if half_hours % 2 else "")

    first = round(sum(per_lesson["00_start_here"]) / 5) * 5
    stated = " ".join(readme.split())  # the paragraph's line breaks fall anywhere
    for claim in (f"Lesson 00 takes about {first} minutes",
                  f"(the template and the doctor), about {spoken(course_time.SHORTEST)} hour",
                  f"about {spoken(FAST, False)} hours, {spoken(FAST)} with its exercises",
                  f"about {spoken(FULL, False)} hours, {spoken(FULL)} with its exercises"):
        assert claim in stated, f"README.md should say {claim!r} (python benchmarks/course_time.py)"


# A notebook run alone from a fresh clone must make the scratch folder it writes to: nbval's order (04 makes it) hid
# that lesson 14 failed when opened first. DCP's save makes its own folder, parents included (FileSystemWriter).
MAKES_ITS_OWN_FOLDER = {"12b_zero_dcp_and_activations": 'args=["--save", "../artifacts/dcp"]'}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_makes_the_scratch_folder_it_writes_to(notebook):
    using = [text(c) for c in cells(notebook) if c["cell_type"] == "code" and "../artifacts" in text(c)]
    if not using or notebook.stem in MAKES_ITS_OWN_FOLDER:
        assert not using or MAKES_ITS_OWN_FOLDER[notebook.stem] in using[0]
        return
    first = using[0]
    assert re.search(r'os\.makedirs\("\.\./artifacts[^"]*", exist_ok=True\)|\.mkdir\(parents=True', first), \
        f"{notebook.name}: the first cell that uses ../artifacts must make it (os.makedirs(..., exist_ok=True))"


# --batch-size is the global batch in some scripts (lesson 00's, the exercise's, 14c's) and per rank in others
# (train_ddp.py, the template): a learner moving between them doubles or halves the batch without noticing. So
# every --batch-size says which in its --help (lesson 14 reconciles the two).
SCRIPTS_WITH_ARGUMENTS = sorted([*(ROOT / "ddp_scripts").glob("*.py"), *(ROOT / "exercises").rglob("*.py")])


def batch_size_help(path):
    import ast
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "--batch-size"):
            yield next((k.value.value for k in node.keywords if k.arg == "help"), None)


def test_every_batch_size_says_whether_it_is_per_rank_or_global():
    found = {path.relative_to(ROOT).as_posix(): list(batch_size_help(path)) for path in SCRIPTS_WITH_ARGUMENTS}
    found = {name: helps for name, helps in found.items() if helps}
    assert len(found) >= 10, found  # the scripts above: the search finds them
    unclear = {name: helps for name, helps in found.items()
               if not all(h and ("per rank" in h or "global batch" in h) for h in helps)}
    assert unclear == {}, f"--batch-size without 'per rank' or 'the global batch' in its help: {unclear}"


def test_no_two_notebooks_name_the_same_scratch_path():
    """tests/conftest.py deletes a notebook's scratch paths before its first cell, which proves it makes them; that
    holds only if no other notebook uses them (nor could read what this one left)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("top_conftest", ROOT / "conftest.py")  # not tests/conftest.py
    top_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(top_conftest)
    scratch_paths = top_conftest.scratch_paths
    owners = {}
    for notebook in NOTEBOOKS:
        for name in scratch_paths(notebook):
            owners.setdefault(name, []).append(notebook.name)
    assert {"artifacts/lesson07", "data/png_digits", "scratch/try_all_reduce.py"} <= set(owners), owners
    shared = {name: names for name, names in owners.items() if len(names) > 1}
    assert shared == {}, f"scratch paths named by more than one notebook: {shared}"
