"""make site: the course as a static site in site/, built from the committed notebooks (never executed) offline.

    .venv/bin/python book/build.py [--out site]

Stages the repository's tracked files in build/site-source/ (README.md becomes the front page), adds to each lesson
how to run it and the scripts it writes, and runs Sphinx with book/conf.py, warnings as errors: a link to a missing
file or section fails the build. The widgets' JavaScript (require.js and @jupyter-widgets/html-manager, kept in
book/vendor/) is served from the site, so a page asks for nothing outside it, and the build needs no network.
"""
import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "site-source"
WIDGET_JS = ROOT / "book" / "vendor"  # require.js and embed-amd.js, from npm: book/vendor/README.md
sys.path.insert(0, str(ROOT))
from lessons import course  # noqa: E402


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def scripts_by_lesson() -> dict[str, list[str]]:
    """ddp_scripts/README.md's map: each lesson's section and the scripts it links."""
    found = {}
    for section in re.split(r"^(?=## )", (ROOT / "ddp_scripts" / "README.md").read_text(), flags=re.M):
        lesson = re.search(r"\(\.\./notebooks/([\w.-]+)\.ipynb\)", section.splitlines()[0] if section else "")
        if lesson:
            found[lesson.group(1)] = re.findall(r"^\| \[([\w.-]+\.py)\]", section, re.M)
    return found


def how_to_run(name: str, scripts: list[str], widgets: bool) -> str:
    lines = [f"> **Run this lesson** on a 2-core CPU, from a clone of the course: `make lab`, then open"
             f" `notebooks/{name}.ipynb`. `make test` runs and checks every lesson; this one alone:"
             f" `make cost LESSON=notebooks/{name}.ipynb`, which checks every output against this page."
             f" The notebook itself, with its outputs: {{download}}`{name}.ipynb <{name}.ipynb>`."]
    if scripts:
        links = ", ".join(f"[{script}](../ddp_scripts/{script})" for script in scripts)
        lines.append(f"> **Its scripts** (each runs on its own under torchrun; the map: "
                     f"[ddp_scripts/README.md](../ddp_scripts/README.md)): {links}.")
    if widgets:
        lines.append("> **Widgets** show the state they were saved with. Move them in JupyterLab, where a kernel"
                     " recomputes what they show.")
    return "\n>\n".join(lines)


TOCTREE = """

```{{toctree}}
:hidden:
:caption: Lessons
{lessons}
```

```{{toctree}}
:hidden:
:caption: Reference
CHEATSHEET
GPU_DAY_ONE
exercises/README
exercises/find_the_hang/README
ddp_scripts/README
notebooks/gpu_report
TESTING
CONTRIBUTING
benchmarks/LOG
```
"""
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)(#[^)\s]*)?\)")


def site_links(page: Path, text: str) -> str:
    """A link to README.md at the top is a link to the front page (index.md) here; a link to a folder, to its
    README.md. Everything else is left as written: a link that leads nowhere fails the build."""
    def fixed(match):
        target, anchor = match.group(1), match.group(2) or ""
        where = (page.parent / target).resolve()
        if where == (STAGE / "README.md").resolve():
            target = target[: -len("README.md")] + "index.md"
        elif where.is_dir() and (where / "README.md").is_file():
            target = target.rstrip("/") + "/README.md"
        return f"]({target}{anchor})"
    return LINK.sub(fixed, text)


def stage() -> None:
    shutil.rmtree(STAGE, ignore_errors=True)
    for name in tracked_files():
        target = STAGE / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    (STAGE / "README.md").rename(STAGE / "index.md")
    with open(STAGE / "index.md", "a") as index:
        index.write(TOCTREE.format(lessons="\n".join(f"notebooks/{lesson}" for lesson in course.FULL)))
    for page in [STAGE / "index.md", *STAGE.glob("*/**/*.md"), *STAGE.glob("*.md"), *STAGE.glob("notebooks/*.ipynb")]:
        page.write_text(site_links(page, page.read_text()))
    scripts = scripts_by_lesson()
    for lesson in course.FULL:
        path = STAGE / "notebooks" / f"{lesson}.ipynb"
        notebook = nbformat.read(path, as_version=4)
        widgets = "widgets" in notebook.metadata
        notebook.cells.insert(1, nbformat.v4.new_markdown_cell(how_to_run(lesson, scripts.get(lesson, []), widgets)))
        nbformat.write(notebook, path)
    static = STAGE / "_static"
    static.mkdir(exist_ok=True)
    for name in ("require.js", "embed-amd.js"):
        shutil.copy2(WIDGET_JS / name, static / name)
    for name in ("lessons.css", "copybutton.js"):
        shutil.copy2(ROOT / "book" / "static" / name, static / name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site")
    options = parser.parse_args()
    started = time.monotonic()
    stage()
    # Sphinx writes into build/ (myst-nb puts its jupyter_execute/ beside the output folder), then it moves to --out.
    built = ROOT / "build" / "site-out" / "site"
    shutil.rmtree(built.parent, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", "-j", "auto",
                           "-c", str(ROOT / "book"), "-d", str(ROOT / "build" / "site-doctrees"), str(STAGE),
                           str(built)])
    if done.returncode:
        return done.returncode
    shutil.rmtree(options.out, ignore_errors=True)
    shutil.move(built, options.out)
    print(f"site: {options.out}/index.html ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
