"""The take-home tools as a learner installs them into a project of their own: a wheel built from this checkout
(what `pip install .` or `pip install git+URL` builds), installed into a fresh venv, used from a folder outside the
checkout. An editable install (`-e`, what `make setup` does) can't show a file the wheel leaves out.

The fresh venv sees this venv's packages (torch, psutil) through a .pth file, not its editable install of the
checkout: a path added by a .pth file is not a site directory, so the editable finder there is never loaded.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT


def run(command, **kwargs):
    return subprocess.run([str(c) for c in command], text=True, capture_output=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                 "--disable-pip-version-check", "-w", out, ROOT], cwd=ROOT)
    assert built.returncode == 0, built.stderr
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' work folder (git-ignored)
    return next(out.glob("*.whl"))


def test_the_wheel_holds_every_file_the_tools_run(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lessons").rglob("*.py") if "__pycache__" not in p.parts}
    assert package - names == set(), "files of lessons/ left out of the wheel"
    assert {"lessons/tools/doctor_site/sitecustomize.py", "lessons/tools/doctor_profile_site/sitecustomize.py",
            "lessons/tools/exercise_checks/common.py"} <= names
    # what the checks of convert_to_ddp and find_the_hang compare the learner's files with
    assert {"lessons/_exercises/single_process_train.py", "lessons/_exercises/solutions/find_the_hang/early_stop.py",
            "lessons/_exercises/find_the_hang/early_stop.py"} <= names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    required = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    tools = sorted(r.split(">")[0].split("<")[0].split("=")[0] for r in required if "extra ==" not in r)
    assert tools == ["numpy", "psutil", "py-spy", "torch"], "the tools need no more; the course is an extra"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"ddp-doctor", "ddp-check"}


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, and this venv's packages (torch...) visible, its `lessons` not."""
    venv = tmp_path_factory.mktemp("learner") / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "course_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    uv = Path(sys.executable).parent / "uv"
    installer = [uv, "pip", "install", "--quiet", "--no-deps", "--python", python] if uv.exists() else \
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site]
    installed = run([*installer, wheel], env={**os.environ, "TMPDIR": str(venv)})
    assert installed.returncode == 0, installed.stderr
    where = run([python, "-c", "import lessons; print(lessons.__file__)"], cwd=venv.parent)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr  # the wheel's, not the checkout's
    return venv


def doctor_in_a_project(venv, project, env):
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return run([venv / "bin" / "ddp-doctor", "train.py", "-n", "2", "--", "ckpt.pt"], cwd=project,
               env={**clean, **env})


def test_the_doctor_from_a_wheel_in_another_project(venv, tmp_path, launch_env):
    """It finds the planted mistakes; and where its instruments don't load in the ranks, it says it saw nothing
    (exit 2, one line), never "no findings"."""
    project = tmp_path / "my_project"
    project.mkdir()
    shutil.copy(ROOT / "ddp_scripts" / "three_mistakes.py", project / "train.py")
    done = doctor_in_a_project(venv, project, launch_env)
    codes = [line.removeprefix("note: ").split(":", 1)[0] for line in done.stdout.splitlines()]
    assert (done.returncode, codes) == (1, ["no-set-epoch", "save-on-every-rank", "weights-only-off",
                                            "map-location-on-gpus"]), done.stdout + done.stderr
    assert "no-set-epoch: train.py:17: " in done.stdout  # the learner's own file:line

    site = next(venv.rglob("lessons/tools/doctor_site/sitecustomize.py"))
    site.write_text("")  # instruments that load nothing: a sitecustomize shadowed, a site dir ignored
    blind = doctor_in_a_project(venv, project, launch_env)
    assert blind.returncode == 2, blind.stdout + blind.stderr
    assert blind.stdout.strip().splitlines() == ["the script did not run to the end: the doctor did not see rank 0:"
                                                 " its instruments did not load there (sitecustomize.py from"
                                                 f" {site.parent} first on PYTHONPATH; python -E or -I ignores"
                                                 " it), so it can't say what the run did"]
    site.unlink()  # a wheel without them, as before the fix: refused before any launch
    missing = doctor_in_a_project(venv, project, launch_env)
    assert missing.returncode == 2 and missing.stdout.startswith(
        "the script did not run to the end: the doctor's instruments are missing from this install"), missing.stdout


def test_the_checker_from_a_wheel_checks_a_file_anywhere(venv, tmp_path, launch_env):
    """ddp-check NAME PATH on an answer outside the checkout; its reference scripts come from the wheel."""
    answer = tmp_path / "my_answers"
    shutil.copytree(ROOT / "exercises" / "solutions" / "find_the_hang", answer)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = run([venv / "bin" / "ddp-check", "find_the_hang", answer], cwd=tmp_path, env={**clean, **launch_env})
    assert done.returncode == 0 and done.stdout.startswith("PASS find_the_hang"), done.stdout + done.stderr
