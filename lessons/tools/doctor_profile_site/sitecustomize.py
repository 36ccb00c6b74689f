"""The doctor's --profile instruments (lessons/tools/doctor.py), loaded into every rank by Python itself.

`python -m lessons doctor SCRIPT --profile` puts this directory first on the ranks' PYTHONPATH, so Python imports
this file at start-up, before the script. It imports nothing of torch's: it waits for the script's own `import torch`
(torch reads at import what the script set before it, OMP_NUM_THREADS among it), then watches the script's optimizer
steps (torch's global step hook) and profiles a few of them with torch.profiler:

    step 1                 not timed: caches warm up (DDP rebuilds its buckets at the next forward)
    steps 2 to 4           timed without the profiler (what the profiler costs is measured against these)
    step 5                 the profiler warms up
    steps 6 to 10          recorded: LESSONS_DOCTOR_DIR/rank<R>.json, a Chrome trace

then stops the profiler and lets the run go on. It also writes rank<R>.steps.json (each step's wall time, and how
far it got) at the first of the end of the profile or the exit. It is inert in torchrun's agent (no RANK), without
LESSONS_DOCTOR_DIR, and in any process a rank starts. It never changes what the run computes; a failure of its own is
written to rank<R>.error and the script goes on. Two profilers at once crash a process (SIGSEGV): when the script's
own torch.profiler runs as ours would start, or starts while ours runs, ours stops, for good, and says so.
"""
import os
import sys
import weakref

UNTIMED, TIMED, WARMUP, ACTIVE = 1, 3, 1, 5
NEEDED = UNTIMED + TIMED + WARMUP + ACTIVE  # optimizer steps a rank must make
STEPPED_BACK = "the script runs its own torch.profiler, so --profile stepped back (its trace is the one to read)"


class _Watcher:
    def __init__(self, out_dir, rank):
        import json
        import time
        import threading
        self.json, self.time, self.threading, self.torch = json, time, threading, None  # torch: at the script's import
        self.sampler = None  # the training thread's lines, sampled through the recorded steps
        self.out_dir, self.rank = out_dir, rank
        self.followed, self.profiler, self.done, self.failed, self.stepped_back = None, None, False, None, False
        self.ours = False  # True while our own profiler is called: a profiler started meanwhile is not the script's
        self.theirs_open = False  # the script's profiler is prepared or running (until it stops)
        self.stamps = []  # perf_counter after each optimizer step
        self.cpu_stamps = []  # process_time then: the CPU the rank's threads got, against the wall time it took

    def attach(self, torch):
        """The script has imported torch: follow its optimizers' steps, and see any profiler it starts."""
        import functools

        import torch.autograd.profiler as autograd_profiler
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self.torch = torch

        def the_scripts(call, opens):  # every torch.profiler and autograd profiler starts and stops through these
            @functools.wraps(call)
            def wrapper(*args, **kwargs):
                if not self.ours:
                    self.theirs_open = opens
                    if opens and self.profiler is not None:  # ours runs: two at once would crash the process
                        self.step_back()
                return call(*args, **kwargs)
            return wrapper
        for name, opens in (("_prepare_profiler", True), ("_enable_profiler", True), ("_disable_profiler", False)):
            if hasattr(autograd_profiler, name):
                setattr(autograd_profiler, name, the_scripts(getattr(autograd_profiler, name), opens))
        register_optimizer_step_post_hook(self.after_step)

    def follows(self, optimizer):
        """Whether OPTIMIZER's step is one of the steps counted: the first optimizer's to step, known by its first
        parameter. An optimizer re-created every few steps keeps it (its id would not); a GAN's second optimizer
        holds other parameters (one cycle, one step). A weak reference: the doctor must not keep a model alive."""
        first = next((p for group in optimizer.param_groups for p in group["params"]), optimizer)
        if self.followed is None or self.followed() is None:  # the first step, or the model followed is gone
            self.followed = weakref.ref(first)
        return self.followed() is first

    def after_step(self, optimizer, args, kwargs):
        if self.done:
            return
        try:
            if not self.follows(optimizer):
                return
            self.stamps.append(self.time.perf_counter())
            self.cpu_stamps.append(self.time.process_time())
            steps = len(self.stamps)
            if steps == UNTIMED + TIMED:
                self.start()
            elif self.profiler is not None:
                self.call_ours(self.profiler.step)
                if steps == UNTIMED + TIMED + WARMUP:  # the recorded steps begin: where does the script spend them
                    self.sampler = _Sampler(self.threading.get_ident())
                if steps == NEEDED:
                    self.call_ours(self.profiler.stop)
                    self.finish()
        except Exception as error:  # never the script's failure: say it, stop profiling
            self.failed = f"{type(error).__name__}: {error}"
            self.finish()

    def call_ours(self, call):
        self.ours = True
        try:
            call()
        finally:
            self.ours = False

    def start(self):
        import socket
        torch = self.torch
        enabled = getattr(torch._C._autograd, "_profiler_enabled", lambda: False)  # also one started otherwise
        if self.theirs_open or enabled():
            return self.step_back()
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
        self.call_ours(self.profiler.start)

    def stop_unexported(self):
        """Stop ours before it is done: a profile cut short is not exported (the doctor says how far it got)."""
        self.profiler.on_trace_ready = None
        self.call_ours(self.profiler.stop)

    def step_back(self):
        """The script's profiler runs with ours, or would: ours, if running, stops first, and never starts again."""
        if self.done:  # ours is over: theirs has the process to itself already
            return
        try:
            if self.profiler is not None:
                self.stop_unexported()
        except Exception:
            pass  # stepping back all the same
        self.failed, self.stepped_back = STEPPED_BACK, True
        self.finish()

    def finish(self):
        if self.done:
            return
        self.done = True
        lines = self.sampler.stop() if self.sampler else {}
        try:
            with open(os.path.join(self.out_dir, f"rank{self.rank}.steps.json"), "w") as f:
                self.json.dump({"stamps": self.stamps, "cpu_stamps": self.cpu_stamps, "needed": NEEDED,
                                "timed": [UNTIMED, UNTIMED + TIMED],
                                "profiled": [UNTIMED + TIMED + WARMUP, NEEDED], "error": self.failed,
                                "stepped_back": self.stepped_back,
                                "lines_ms": lines, "sampled_steps": ACTIVE}, f)
        except OSError:
            pass  # the doctor's folder is gone (it gave up on the run): nowhere to say it, and never the script's error

    def at_exit(self):
        if self.profiler is not None and not self.done:
            try:
                self.stop_unexported()
            except Exception:
                pass
        self.finish()


class _WhenImported:
    """A sys.meta_path finder that runs THEN(module) once the first `import NAME` has run NAME's code, before the
    import returns to whoever asked: nothing is imported ahead of the script. It finds nothing itself: it asks the
    finders after it, and wraps the loader's exec_module for that one import only."""

    def __init__(self, name, then, failed):
        self.name, self.then, self.failed, self.seen = name, then, failed, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.seen:
            return None
        self.seen = True
        others = (f for f in list(sys.meta_path) if f is not self and hasattr(f, "find_spec"))
        spec = next((s for s in (f.find_spec(fullname, path, target) for f in others) if s is not None), None)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        then = self.then

        def exec_module(module):
            del loader.exec_module  # the loader's own again, for anything that uses it later
            loader.exec_module(module)
            then(module)
        try:
            loader.exec_module = exec_module
        except AttributeError as error:  # a loader that takes no attribute: no instruments, and the doctor says so
            self.failed(error)
        return spec


def _write_error(out_dir, error):
    try:
        with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.error"), "w") as f:
            f.write(f"{type(error).__name__}: {error}\n")
    except OSError:
        pass  # the doctor's folder is gone: nowhere to say it, and never the script's error


class _Sampler:
    """Where the training thread is, every INTERVAL s: the innermost line of the script's own files (under the
    script's folder, not an installed package) on its stack, as {"train.py:75 in main": ms}. A thread that wakes
    every few ms, not the profiler's with_stack, which records every Python call and slows a Python-heavy step many
    times over: the lines say where a straggler's extra time goes."""
    INTERVAL = 0.002

    def __init__(self, thread_id):
        import threading
        self.thread_id, self.ms, self.running, self.seen = thread_id, {}, True, {}
        self.folder = os.path.dirname(os.path.abspath(sys.argv[0])) + os.sep if sys.argv and sys.argv[0] else None
        self.thread = threading.Thread(target=self.run, name="lessons-doctor-sampler", daemon=True)
        self.thread.start()

    def run(self):
        import time
        last = time.perf_counter()
        while self.running:
            time.sleep(self.INTERVAL)
            now = time.perf_counter()
            frame = sys._current_frames().get(self.thread_id)
            while frame is not None and not self.own(frame.f_code.co_filename):
                frame = frame.f_back
            if frame is not None:
                line = (f"{os.path.relpath(os.path.abspath(frame.f_code.co_filename), self.folder)}:{frame.f_lineno}"
                        f" in {frame.f_code.co_name}")
                self.ms[line] = self.ms.get(line, 0.0) + 1e3 * (now - last)
            last = now

    def own(self, path):
        """A file of the script's own (a frame names it as the script was started: a relative path, maybe)."""
        if path not in self.seen:
            full = os.path.abspath(path)
            self.seen[path] = bool(self.folder) and full.startswith(self.folder) and "site-packages" not in full
        return self.seen[path]

    def stop(self):
        self.running = False
        self.thread.join(timeout=1)
        return dict(self.ms)


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

        def attach(torch):
            try:
                watcher.attach(torch)
            except Exception as error:  # the instruments must never be why a script fails
                _write_error(out_dir, error)
        sys.meta_path.insert(0, _WhenImported("torch", attach, lambda error: _write_error(out_dir, error)))
    except Exception as error:
        _write_error(out_dir, error)


_activate()
