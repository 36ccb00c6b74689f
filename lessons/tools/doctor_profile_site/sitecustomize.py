"""The doctor's --profile instruments (lessons/tools/doctor.py), loaded into every rank by Python itself.

`python -m lessons doctor SCRIPT --profile` puts this directory first on the ranks' PYTHONPATH, so Python imports
this file at start-up, before the script. It watches the script's optimizer steps (torch's global step hook) and
profiles a few of them with torch.profiler:

    step 1                 not timed: caches warm up (DDP rebuilds its buckets at the next forward)
    steps 2 to 4           timed without the profiler (what the profiler costs is measured against these)
    step 5                 the profiler warms up
    steps 6 to 10          recorded: LESSONS_DOCTOR_DIR/rank<R>.json, a Chrome trace

then stops the profiler and lets the run go on. It also writes rank<R>.steps.json (each step's wall time, and how
far it got) at the first of the end of the profile or the exit. It is inert in torchrun's agent (no RANK), without
LESSONS_DOCTOR_DIR, and in any process a rank starts. It never changes what the run computes; a failure of its own is
written to rank<R>.error and the script goes on.
"""
import os

UNTIMED, TIMED, WARMUP, ACTIVE = 1, 3, 1, 5
NEEDED = UNTIMED + TIMED + WARMUP + ACTIVE  # optimizer steps a rank must make


class _Watcher:
    def __init__(self, out_dir, rank):
        import json
        import time

        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self.torch, self.json, self.time = torch, json, time
        self.out_dir, self.rank = out_dir, rank
        self.optimizer, self.profiler, self.done, self.failed = None, None, False, None
        self.stamps = []  # perf_counter after each optimizer step
        register_optimizer_step_post_hook(self.after_step)

    def after_step(self, optimizer, args, kwargs):
        if self.done or self.failed:
            return
        if self.optimizer is None:  # the first optimizer that steps is the one counted (a GAN's two: one cycle)
            self.optimizer = id(optimizer)
        if id(optimizer) != self.optimizer:
            return
        try:
            self.stamps.append(self.time.perf_counter())
            steps = len(self.stamps)
            if steps == UNTIMED + TIMED:
                self.start()
            elif self.profiler is not None:
                self.profiler.step()
                if steps == NEEDED:
                    self.profiler.stop()
                    self.finish()
        except Exception as error:  # never the script's failure: say it, stop profiling
            self.failed = f"{type(error).__name__}: {error}"
            self.finish()

    def start(self):
        import socket
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities, schedule=torch.profiler.schedule(wait=0, warmup=WARMUP, active=ACTIVE, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(self.out_dir, f"rank{self.rank}.json")))
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.profiler.preset_metadata_json("threads_and_cores", self.json.dumps(
            {"threads": torch.get_num_threads(), "cores": len(cpus) or os.cpu_count(), "cpus": cpus,
             "host": socket.gethostname()}))
        self.profiler.start()

    def finish(self):
        if self.done:
            return
        self.done = True
        with open(os.path.join(self.out_dir, f"rank{self.rank}.steps.json"), "w") as f:
            self.json.dump({"stamps": self.stamps, "needed": NEEDED, "timed": [UNTIMED, UNTIMED + TIMED],
                            "profiled": [UNTIMED + TIMED + WARMUP, NEEDED], "error": self.failed}, f)

    def at_exit(self):
        if self.profiler is not None and not self.done:
            try:
                self.profiler.stop()  # a profile cut short: not exported, the doctor says how far it got
            except Exception:
                pass
        self.finish()


def _activate():  # the same guard as doctor_site/sitecustomize.py's: each site is loaded alone, by Python
    out_dir = os.environ.get("LESSONS_DOCTOR_DIR")
    if not out_dir or "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return  # not the doctor's launch, or torchrun's agent
    owner = os.environ.get("LESSONS_DOCTOR_RANK_PID")
    if owner and owner != str(os.getpid()):
        return  # a process the rank started: it inherits the environment, not the job
    os.environ["LESSONS_DOCTOR_RANK_PID"] = str(os.getpid())
    try:
        import atexit
        watcher = _Watcher(out_dir, int(os.environ["RANK"]))
        atexit.register(watcher.at_exit)
    except Exception as error:  # the instruments must never be why a script fails
        with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.error"), "w") as f:
            f.write(f"{type(error).__name__}: {error}\n")


_activate()
