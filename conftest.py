"""Loaded by every pytest run from the top of the repository, whatever the paths given (a notebook alone too)."""
import json
import os
import re
import shutil
from pathlib import Path

# nbval compares the notebooks' printed floats and parameter hashes bit for bit, and torch's CPU kernels give other
# bits on other instruction sets: ATen's vectorised sums (AVX-512 against AVX2), oneDNN's convolutions and MKL's GEMMs
# each pick a code path by CPU. The same notebook gave other digits on two machines of this workplace. So every process
# of a test run (the kernels and the ranks inherit it) uses the AVX2 paths, which every x86 machine here has; the
# committed outputs were made the same way (TESTING.md). Learners' runs are not pinned.
CPU_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
for _name, _value in CPU_PINS.items():
    os.environ.setdefault(_name, _value)

# Two pytest workers keep both cores busy, and an OpenMP thread that waits for its partner spins by default: a
# 2-thread training loop in a kernel took 2.4 s and 3.1 CPU-s with the other core busy, 1.3 s and 1.2 CPU-s with
# passive waiting (benchmarks/omp_wait_policy.py). Passive waiting changes no result, only who burns the CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent

# Every notebook runs alone from a fresh clone: it makes what it needs. nbval runs the notebooks in order, which
# would hide a notebook that reads what an earlier one (or its own last run) left in the git-ignored scratch
# folders. So before a notebook's first cell, the scratch paths it names are deleted: it must make them again. The
# paths of two notebooks never overlap (tests/test_course_shape.py), so one group's deletion cannot touch what the
# notebook running on the other worker uses, and no notebook can read another's.
SCRATCH = re.compile(r"\.\./(artifacts|data|scratch)/([\w.\-]+)")


def scratch_paths(notebook: Path) -> set[str]:
    """The scratch paths a notebook's code names, as 'artifacts/lesson07': the first level under each folder."""
    cells = json.loads(notebook.read_text())["cells"]
    return {f"{folder}/{name}" for cell in cells if cell["cell_type"] == "code"
            for folder, name in SCRATCH.findall("".join(cell["source"]))}


def clear_scratch(notebook: Path) -> None:
    """Delete the scratch paths a notebook names, before it runs (nbval here; `make execute` too)."""
    for name in scratch_paths(notebook):
        target = ROOT / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


def pytest_runtest_setup(item):  # here, not in tests/conftest.py, which a run of notebooks alone does not load
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb" and item.name == "Cell 0":
        clear_scratch(path)
