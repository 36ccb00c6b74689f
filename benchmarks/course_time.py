"""How long each lesson and each track takes a learner, estimated the way the README states it.

    python benchmarks/course_time.py

An estimate, not a stopwatch on a learner. Per lesson: the words of the markdown cells at a technical reading pace,
the lines of the code cells read as code, each launch (a cell that starts torchrun or python processes) waited for
and its output read, and each exercise (a cell that runs `lessons.check`) written and checked. A learner's walk of
the fast track in order took about 4 hours (issue 36), against 3 from the first, lighter rates (200 words and 15
lines a minute, 10 s a launch, no exercises); these rates are the slower ones such a walk shows.
"""
import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# The tracks (README.md; tests/test_course_shape.py checks that the lessons' "Next" cells follow them).
FAST = ["00_start_here", "04_ddp_training", "05_distributed_sampler", "07_checkpoints", "11_debugging",
        "14_your_own_script", "14b_the_ddp_doctor", "13_training_loop", "13b_stopping_lr_and_compile"]
# To your own script on N devices: the template, and the doctor.
SHORTEST = ["00_start_here", "14_your_own_script", "14b_the_ddp_doctor"]
WORDS_PER_MINUTE = 150  # technical prose, read to be used (200 is the pace of plain prose)
CODE_LINES_PER_MINUTE = 10
LAUNCH_MINUTES = 0.5  # the launch itself (4 to 10 s on a laptop), then reading what each rank printed
EXERCISE_MINUTES = 20
LAUNCH = re.compile(r"lessons\.(torchrun|torchrun_nodes|run_python|doctor)\(|^%%torchrun", re.M)
EXERCISE = re.compile(r"lessons\.check\(")


def minutes(notebook: Path) -> tuple[float, float]:
    """(reading, code and launches; the exercises) in minutes."""
    words = lines = launches = exercises = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(source.split())
        elif cell["cell_type"] == "code":
            lines += sum(1 for line in source.splitlines() if line.strip())
            exercises += len(EXERCISE.findall(source))
            if "nbval-skip" not in cell["metadata"].get("tags", []):  # GPU-only cells: not run on a laptop
                launches += len(LAUNCH.findall(source))
    return (words / WORDS_PER_MINUTE + lines / CODE_LINES_PER_MINUTE + launches * LAUNCH_MINUTES,
            exercises * EXERCISE_MINUTES)


def hours(per_lesson: dict, names: list[str], with_exercises: bool = True) -> float:
    return sum(lesson + (exercise if with_exercises else 0) for lesson, exercise in
               (per_lesson[name] for name in names)) / 60


def main():
    per_lesson = {nb.stem: minutes(nb) for nb in sorted(NOTEBOOKS.glob("*.ipynb"))}
    for name, (lesson, exercise) in per_lesson.items():
        print(f"{lesson:6.0f} min  {name}" + (f"  (+ {exercise:.0f} min of exercise)" if exercise else ""))
    full = list(per_lesson)
    for label, track in (("shortest route (00, 14, 14b)", SHORTEST), ("fast track", FAST), ("full track", full)):
        print(f"{label}: {hours(per_lesson, track):.1f} h with its exercises, "
              f"{hours(per_lesson, track, with_exercises=False):.1f} h without")


if __name__ == "__main__":
    main()
