"""Check of exercises/find_the_hang/: the learner's fixed scripts must finish, with the reference's RESULT line.

The learner's path is a folder holding rank_conditional.py, early_stop.py and shape_mismatch.py. At 3 ranks, in
one launch, each fixed script runs as __main__ in every rank (runpy), its init_process_group() getting a fresh
process group; then the reference solution (exercises/solutions/find_the_hang/) runs the same way, and rank 0's
RESULT lines must agree. lessons.check's timeout counts from the start line: a script that still hangs is stopped
there, and lessons.check prints where each rank was in it (the "EXERCISE CASE" line names the script).
"""
import contextlib
import io
import json
import runpy
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

import common
from common import RANK, case, fail, passed, start

SCRIPTS = ("rank_conditional.py", "early_stop.py", "shape_mismatch.py")
REFERENCE = common.EXERCISES / "solutions" / "find_the_hang"
WORLD = 3
real_init = dist.init_process_group
runs = 0


class Tee(io.TextIOBase):
    """Print as usual (lessons.check may need the lines) and keep a copy to read RESULT from."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def parse_result(text: str) -> dict | None:
    """The JSON of the last `RESULT {...}` line, as lessons.torchrun reads it."""
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def run(script: Path, who: str) -> dict | None:
    """Run the script as __main__ with a fresh process group of WORLD ranks; rank 0's RESULT, or None."""
    global runs
    runs += 1

    def init_process_group(backend=None, init_method=None, *args, **kwargs):
        kwargs.update(store=dist.PrefixStore(f"find_the_hang_{runs}", common._store), rank=RANK, world_size=WORLD)
        return real_init(backend or "gloo", *args, **kwargs)
    dist.init_process_group = init_process_group
    sys.argv = [str(script)]
    tee = Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as end:
        if end.code not in (None, 0):
            fail(f"{who} {script.name} exited with {end.code!r} on rank {RANK}")
    except BaseException as error:
        traceback.print_exc()
        frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename) == script]
        at = f" at {script.name}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
        first = str(error).splitlines()[0] if str(error) else ""
        fail(f"{who} {script.name} failed on rank {RANK}{at}: {type(error).__name__}: {first}")
    finally:
        dist.init_process_group = real_init
    if dist.is_initialized():
        dist.destroy_process_group()
    return parse_result(tee.copy.getvalue())


def main():
    folder = common.learner_path()
    missing = [s for s in SCRIPTS if not (folder / s).is_file()]
    if missing:
        fail(f"{folder} has no {', '.join(missing)}: the check runs your fixed copies of the scripts in "
             "exercises/find_the_hang/, from a folder that holds all three")
    start()
    for script in SCRIPTS:
        case(f"{script} at {WORLD} ranks")
        got = run(folder / script, "your")
        expected = run(REFERENCE / script, "the reference")
        if RANK == 0 and got != expected:
            fail(f"{script} finished, but its RESULT is {got} and the reference's is {expected}: "
                 + ("rank 0 printed no RESULT line" if got is None else "the fix changed what the script computes"))
    passed(f"{', '.join(SCRIPTS)} at {WORLD} ranks: each finished, with the reference's RESULT")


if __name__ == "__main__":
    main()
