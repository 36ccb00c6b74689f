"""make compat: the take-home tools on other torch versions than the course's pin (not part of make test).

    .venv/bin/python benchmarks/compat.py [--torch 2.4.1 newest] [--keep]

A learner installs the course next to their own packages and their own torch. For each torch version this builds a
venv in .compat/ with uv (uv's cache keeps the wheels for the next run): that torch, what the take-home tools import
(psutil, py-spy, NumPy, scikit-learn for the offline digits), and the course itself, `uv pip install -e . --no-deps`:
without its other dependencies, as next to a learner's own packages (torch 2.15 has no torchvision on the registry,
and the tools don't need one). Then it runs there:

- the template on 2 ranks through lessons.torchrun (one epoch);
- two exercise checks on their solutions: ring_allreduce and resume;
- the doctor on tests/scripts/doctor/mistakes_then_crash.py (exit 2 and the five findings the pinned torch gives),
  and --compare on tests/scripts/doctor/data_mistakes.py (exit 0: the same model).

One line per version and check, then the table the README quotes. Exit status 0 when everything passed.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / ".compat"
CRASH_CODES = ["collectives-differ", "params-diverged", "no-set-epoch", "save-on-every-rank", "weights-only-off"]


def run(command, **kwargs):
    return subprocess.run([str(c) for c in command], cwd=ROOT, text=True, capture_output=True, **kwargs)


def build(version: str) -> tuple[Path | None, str]:
    """A venv with torch==VERSION (or the newest torch), and the course installed into it."""
    venv = COMPAT / f"torch-{version}"
    python = venv / "bin" / "python"
    uv = [ROOT / ".venv" / "bin" / "uv"]
    if not python.exists():
        done = run([*uv, "venv", "--quiet", "--python", sys.executable, venv])
        if done.returncode:
            return None, done.stderr.strip().splitlines()[-1]
    spec = "torch" if version == "newest" else f"torch=={version}"
    numpy = "numpy<2" if version.startswith(("2.0", "2.1", "2.2", "2.3", "2.4")) else "numpy"  # built against 1.x
    for packages in ([spec, numpy, "scikit-learn", "psutil", "py-spy"], ["--no-deps", "-e", "."]):
        done = run([*uv, "pip", "install", "--quiet", "--python", python, *packages], timeout=1800)
        if done.returncode:
            return None, (done.stderr.strip().splitlines() or ["uv failed"])[-1]
    installed = run([python, "-c", "import torch; print(torch.__version__)"])
    return python, installed.stdout.strip()


def checks(python: Path) -> list[tuple[str, bool, str]]:
    """(what, passed, one line of evidence) for each check, in this venv."""
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        done = run([python, "-c", "import lessons; r = lessons.torchrun('ddp_scripts/template.py', nproc=2, "
                    "args=['--epochs', '1'], show=False, timeout=600); print(r.result['test_samples'])"])
        results.append(("template, 2 ranks", done.returncode == 0 and done.stdout.strip() == "297",
                        (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]))
        for name in ("ring_allreduce", "resume"):
            done = run([python, "-m", "lessons.check", name, ROOT / "exercises" / "solutions" / f"{name}.py"])
            results.append((f"check {name} (its solution)", done.returncode == 0, done.stdout.splitlines()[:1]))
        done = run([python, "-m", "lessons", "doctor", "tests/scripts/doctor/mistakes_then_crash.py", "-n", "2",
                    "--", Path(scratch) / "ckpt.pt"])
        codes = [line.split(":", 1)[0] for line in done.stdout.splitlines() if not line.startswith("the script")]
        results.append(("doctor, five mistakes then a crash", done.returncode == 2 and codes == CRASH_CODES,
                        [f"exit {done.returncode}: {', '.join(codes)}"]))
        done = run([python, "-m", "lessons", "doctor", "tests/scripts/doctor/data_mistakes.py", "-n", "2",
                    "--compare"])
        results.append(("doctor --compare, a correct script", done.returncode == 0, done.stdout.splitlines()[-1:]))
    return [(what, ok, (evidence or [""])[0][:100]) for what, ok, evidence in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", nargs="+", default=["2.4.1", "newest"], help="versions, or 'newest'")
    options = parser.parse_args()
    rows, failed = [], 0
    for version in options.torch:
        start = time.monotonic()
        python, installed = build(version)
        if python is None:
            print(f"torch {version}: the venv could not be built: {installed}")
            rows.append((version, "not built", installed))
            failed += 1
            continue
        for what, ok, evidence in checks(python):
            print(f"torch {installed}: {'PASS' if ok else 'FAIL'} {what}: {evidence}", flush=True)
            rows.append((installed, "pass" if ok else "FAIL", what))
            failed += not ok
        print(f"torch {installed}: {time.monotonic() - start:.0f} s, install included")
    print("\n| torch | check | result |\n|---|---|---|")
    for installed, result, what in rows:
        print(f"| {installed} | {what} | {result} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
