"""What every installer shares: the rank's log, the ids it gives, where a call came from (_Recorder); how a callable
is replaced (_replace); how a path is shown; and the end of the run (install_exit: the parameters to compare, and
whether the group was left)."""
import os
import sys

INSTRUMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # doctor_site/: not the script
INDICES_PER_PASS = 200_000  # the indices kept of one pass: enough to compare ranks, bounded for a huge data set
RECORDED_PASSES = 4  # per loader site: the first passes are enough to see who drew what


def _replace(owner, name, make):
    """owner.name = make(original), keeping the original's signature, name and attributes."""
    import functools
    original = getattr(owner, name)
    setattr(owner, name, functools.wraps(original)(make(original)))


class _Recorder:
    """What every installer shares: the rank's log, the ids it gives, where a call came from."""

    def __init__(self, out_dir, rank):
        import json

        import torch
        self.out_dir, self.rank, self.torch, self._json, self.pid = out_dir, rank, torch, json, os.getpid()
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.log = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)  # line-buffered: survives a kill
        self.steps, self.objects = 0, 0
        self.last_rng, self.new_pass, self.rng_per_step = None, True, False
        self.rng_first_step = None  # the random state after the first step: the same on every rank, or not
        self.rng_first_batch = None  # ... and when the first step's batch was drawn, before its forward
        self.optimizers = []  # held: a model local to main() is gone by exit
        self.first_params, self.after_first = {}, {}  # --compare: each optimizer's parameters before and after step 1
        self.wrapped = []  # the modules DDP wraps
        self.sharded_modules = []  # the modules FullyShardedDataParallel wraps: their parameters are shards
        self.joined = 0  # inside how many Join contexts (DDP's join(), Join([...])): uneven batches are handled
        self.at_exit = []  # what each installer adds to the exit
        self.open_passes = {}  # each loader's pass in progress (by the loader's id)

    def event(self, what, **fields):
        if os.getpid() != self.pid:  # a process the rank forked (a DataLoader worker) inherits the wrappers: inert
            return
        self.log.write(self._json.dumps({"event": what, **fields}) + "\n")

    def site(self, skip_torch=True):
        """file:line of the first frame that is the script's (or a library's), not torch's or this file's."""
        frame = sys._getframe(1)
        while frame is not None:
            name = os.path.abspath(frame.f_code.co_filename)
            if not name.startswith(INSTRUMENTS) and not (skip_torch and name.startswith(self.torch_dir)) \
                    and not frame.f_code.co_filename.startswith("<frozen"):
                return f"{shown_path(name)}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def made_by_torch(self):
        """True when torch itself made the object under construction (ZeroRedundancyOptimizer's inner optimizer):
        the first frame outside torch.optim's classes and this file is another part of torch."""
        frame = sys._getframe(2)
        optim_dir = self.torch_dir + "optim" + os.sep
        while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(INSTRUMENTS)
                                     or os.path.abspath(frame.f_code.co_filename).startswith(optim_dir)):
            frame = frame.f_back
        return frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(self.torch_dir)

    def called_from_torch(self):
        """True when the caller of our wrapper is torch itself (SyncBatchNorm, DDP's join, DCP...)."""
        frame = sys._getframe(2)
        return frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(self.torch_dir)

    def sharded_ids(self):
        return {id(p) for module in self.sharded_modules for p in module.parameters()}

    def rng_digest(self):
        """A digest of this rank's random state: the CPU's generator, and the GPU's where CUDA runs (dropout on a
        GPU draws from it)."""
        import hashlib
        digest = hashlib.sha1(self.torch.get_rng_state().numpy().tobytes())
        if self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
            digest.update(self.torch.cuda.get_rng_state().numpy().tobytes())
        return digest.hexdigest()

    def new_id(self):
        self.objects += 1
        return self.objects


def shown_path(name):
    """A path as the script's reader knows it: relative to the working directory (the script's own
    "../ddp_scripts/x.py" too), absolute when that would climb more than one folder (a library's file, /tmp). The
    working directory is the ranks': --compare's one process, run in a folder of its own, names its sites as the
    ranks do (LESSONS_DOCTOR_SITE_ROOT), or no loader of theirs would match one of its own."""
    try:
        relative = os.path.relpath(name, os.environ.get("LESSONS_DOCTOR_SITE_ROOT") or os.getcwd())
    except ValueError:  # another drive
        return name
    return name if relative.startswith(os.path.join("..", "..")) else relative


# --- the end: the parameters to compare, and whether the group was left --------------------------------------------

def install_exit(rec):
    import atexit
    import gc

    import torch
    import torch.distributed as dist

    original_save = torch.save.__wrapped__ if hasattr(torch.save, "__wrapped__") else torch.save

    def at_exit():
        params = {}
        for add in rec.at_exit:
            try:
                add(params)
            except Exception as error:  # noqa: BLE001  said, never silent: the doctor then can't vouch for the run
                with open(os.path.join(rec.out_dir, f"rank{rec.rank}.error"), "a") as f:
                    f.write(f"at exit, {add.__name__}: {type(error).__name__}: {error}\n")
        if params:
            original_save(params, os.path.join(rec.out_dir, f"rank{rec.rank}.params.pt"))
        rec.event("exit", initialized=dist.is_available() and dist.is_initialized(), steps=rec.steps,
                  optimizers=len(rec.optimizers), ddp_modules=len(rec.wrapped), rng_per_step=rec.rng_per_step,
                  rng_first_step=rec.rng_first_step, rng_first_batch=rec.rng_first_batch,
                  first_lrs=[getattr(rec, "first_lrs", {}).get(id(o)) for o in rec.optimizers],
                  travelled=getattr(rec, "travelled", 0.0))
        rec.log.close()
        gc.collect()  # DDP's reference cycle, and the process group it holds, go while Python is still whole

    atexit.register(at_exit)
