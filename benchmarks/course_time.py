"""How long each lesson and each track takes a learner, estimated the way the README states it.

    python benchmarks/course_time.py

An estimate, not a stopwatch on a learner: the words of the markdown cells at 200 words a minute, the lines of the
code cells at 15 lines a minute, and each launch (a cell that starts torchrun or python processes) at 10 seconds.
"""
import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
FAST = ["00_start_here", "04_ddp_training", "13_training_loop", "13b_stopping_lr_and_compile",
        "05_distributed_sampler", "07_checkpoints", "11_debugging", "14_your_own_script"]
LAUNCH = re.compile(r"lessons\.(torchrun|torchrun_nodes|run_python|doctor|check)\(|^%%torchrun", re.M)


def minutes(notebook: Path) -> float:
    words = lines = launches = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(source.split())
        elif cell["cell_type"] == "code":
            lines += sum(1 for line in source.splitlines() if line.strip())
            if "nbval-skip" not in cell["metadata"].get("tags", []):  # GPU-only and exercise checks: not run here
                launches += len(LAUNCH.findall(source))
    return words / 200 + lines / 15 + launches * 10 / 60


def main():
    per_lesson = {nb.stem: minutes(nb) for nb in sorted(NOTEBOOKS.glob("*.ipynb"))}
    for name, m in per_lesson.items():
        print(f"{m:6.0f} min  {name}")
    fast = sum(per_lesson[name] for name in FAST if name in per_lesson)
    missing = [name for name in FAST if name not in per_lesson]
    print(f"fast track: {fast / 60:.1f} h" + (f" (without {', '.join(missing)}: not written yet)" if missing else ""))
    print(f"full track: {sum(per_lesson.values()) / 60:.1f} h")


if __name__ == "__main__":
    main()
