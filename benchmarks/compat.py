"""make compat: the take-home tools installed from a wheel, on other torch versions than the course's pin (not
part of make test).

    .venv/bin/python benchmarks/compat.py [--torch 2.4.1 newest]

A learner adds the tools to a project of their own, next to their own torch: `pip install` of this repository builds
a wheel. So this builds that wheel once, and for each torch version a venv in .compat/ with uv (uv's cache keeps the
wheels for the next run): that torch, then the wheel with its own dependencies (nothing of the course's extra), and
scikit-learn, which the template's example data needs (the template is a file the learner copies, not the package).
Then, from a folder outside the checkout, with copies of the files a learner would have:

- the template on 2 ranks through lessons.torchrun (one epoch);
- `ddp-check` on two solutions: ring_allreduce and resume;
- `ddp-doctor` on tests/scripts/doctor/mistakes_then_crash.py (exit 2 and the five findings the pinned torch
  gives), and --compare on tests/scripts/doctor/data_mistakes.py (exit 0: the same model).

One line per version and check, the venv's size, then the table for benchmarks/LOG.md. Exit status 0 when everything
passed.
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / ".compat"
CRASH_CODES = ["collectives-differ", "params-diverged", "no-set-epoch", "save-on-every-rank", "weights-only-off"]
LEARNER_FILES = {"template.py": "ddp_scripts/template.py",
                 "mistakes_then_crash.py": "tests/scripts/doctor/mistakes_then_crash.py",
                 "data_mistakes.py": "tests/scripts/doctor/data_mistakes.py",
                 "ring_allreduce.py": "exercises/solutions/ring_allreduce.py",
                 "resume.py": "exercises/solutions/resume.py"}


def run(command, cwd=ROOT, **kwargs):
    return subprocess.run([str(c) for c in command], cwd=cwd, text=True, capture_output=True, **kwargs)


def build_wheel() -> Path:
    out = COMPAT / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    done = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", out, ROOT])
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    if done.returncode:
        sys.exit(f"the wheel could not be built: {done.stderr.strip().splitlines()[-1:]}")
    return next(out.glob("*.whl"))


def build(version: str, wheel: Path) -> tuple[Path | None, str]:
    """A fresh venv with torch==VERSION (or the newest torch), then the wheel and its dependencies."""
    venv = COMPAT / f"torch-{version}"
    shutil.rmtree(venv, ignore_errors=True)
    python = venv / "bin" / "python"
    uv = [ROOT / ".venv" / "bin" / "uv"]
    done = run([*uv, "venv", "--quiet", "--python", sys.executable, venv])
    if done.returncode:
        return None, done.stderr.strip().splitlines()[-1]
    spec = "torch" if version == "newest" else f"torch=={version}"
    numpy = "numpy<2" if version.startswith(("2.0", "2.1", "2.2", "2.3", "2.4")) else "numpy"  # built against 1.x
    for packages in ([spec, numpy], [wheel, spec, numpy, "scikit-learn"]):
        done = run([*uv, "pip", "install", "--quiet", "--python", python, *packages], timeout=1800)
        if done.returncode:
            return None, (done.stderr.strip().splitlines() or ["uv failed"])[-1]
    installed = run([python, "-c", "import torch; print(torch.__version__)"])
    return python, installed.stdout.strip()


def checks(python: Path) -> list[tuple[str, bool, str]]:
    """(what, passed, one line of evidence) for each check, run in a folder outside the checkout."""
    results = []
    bin_dir = python.parent
    with tempfile.TemporaryDirectory() as project:
        for name, source in LEARNER_FILES.items():
            shutil.copy(ROOT / source, Path(project) / name)
        done = run([python, "-c", "import lessons; print(lessons.__file__)"], cwd=project)
        results.append(("lessons imported from the wheel", done.stdout.startswith(str(python.parents[1])),
                        [done.stdout.strip()]))
        done = run([python, "-c", "import lessons; r = lessons.torchrun('template.py', nproc=2, "
                    "args=['--epochs', '1'], show=False, timeout=600); print(r.result['test_samples'])"], cwd=project)
        results.append(("template, 2 ranks", done.returncode == 0 and done.stdout.strip() == "297",
                        (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]))
        for name in ("ring_allreduce", "resume"):
            done = run([bin_dir / "ddp-check", name, f"{name}.py"], cwd=project)
            results.append((f"ddp-check {name} (its solution)", done.returncode == 0, done.stdout.splitlines()[:1]))
        done = run([bin_dir / "ddp-doctor", "mistakes_then_crash.py", "-n", "2", "--", "ckpt.pt"], cwd=project)
        codes = [line.split(":", 1)[0] for line in done.stdout.splitlines() if not line.startswith("the script")]
        results.append(("ddp-doctor, five mistakes then a crash", done.returncode == 2 and codes == CRASH_CODES,
                        [f"exit {done.returncode}: {', '.join(codes)}"]))
        done = run([bin_dir / "ddp-doctor", "data_mistakes.py", "-n", "2", "--compare"], cwd=project)
        results.append(("ddp-doctor --compare, a correct script", done.returncode == 0, done.stdout.splitlines()[-1:]))
    return [(what, ok, (evidence or [""])[0][:100]) for what, ok, evidence in results]


def size(path: Path) -> str:
    return run(["du", "-sh", path]).stdout.split()[0]


def added_by_the_tools(python: Path) -> str:
    """What the wheel and its own dependencies (beside torch and NumPy, which a learner's project has) weigh."""
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    ours = ("lessons", "psutil", "py_spy", "ddp_lessons")
    parts = [p for p in site.iterdir() if p.name.split("-")[0].lower() in ours]
    parts += [python.parent / "py-spy", python.parent / "ddp-doctor", python.parent / "ddp-check"]
    done = run(["du", "-csh", *[p for p in parts if p.exists()]])
    return done.stdout.splitlines()[-1].split()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", nargs="+", default=["2.4.1", "newest"], help="versions, or 'newest'")
    options = parser.parse_args()
    rows, failed = [], 0
    wheel = build_wheel()
    print(f"built {wheel.name}")
    for version in options.torch:
        start = time.monotonic()
        python, installed = build(version, wheel)
        if python is None:
            print(f"torch {version}: the venv could not be built: {installed}")
            rows.append((version, "not built", installed))
            failed += 1
            continue
        for what, ok, evidence in checks(python):
            print(f"torch {installed}: {'PASS' if ok else 'FAIL'} {what}: {evidence}", flush=True)
            rows.append((installed, "pass" if ok else "FAIL", what))
            failed += not ok
        print(f"torch {installed}: {time.monotonic() - start:.0f} s, install included; the venv:"
              f" {size(python.parents[1])}, of which the tools and their own dependencies {added_by_the_tools(python)}")
    print("\n| torch | check | result |\n|---|---|---|")
    for installed, result, what in rows:
        print(f"| {installed} | {what} | {result} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
