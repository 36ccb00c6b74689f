"""The DDP doctor's instruments (lessons/doctor.py), loaded into every rank by Python itself.

The doctor puts this directory first on the ranks' PYTHONPATH, so Python imports this file at start-up, before the
script. It records what the rank does into LESSONS_DOCTOR_DIR/rank<R>.jsonl, one JSON event per line, written as it
happens (a rank that hangs and is killed has still written its collectives). It is inert in torchrun's agent (no
RANK), without LESSONS_DOCTOR_DIR, and in any process a rank starts (DataLoader workers, compile workers).
"""
import os


def _install(out_dir, rank):
    import atexit
    import json

    import gc

    import torch
    import torch.distributed as dist
    # Not an instrument: the course's teardown fix (ddp_scripts/ddp_common.py, appendix section 5), so that a
    # script's rare abort at exit (a gloo thread meeting Python's shutdown) never fails the doctor's launch. Imported
    # here, before the script's init_process_group; the garbage is collected in at_exit below.
    import torch.distributed.nn  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    log = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)  # line-buffered: survives a kill

    def event(kind, **fields):
        log.write(json.dumps({"event": kind, **fields}) + "\n")

    # no-set-epoch: which epoch each shuffling sampler was at, every time an iteration over it starts.
    original_iter = DistributedSampler.__iter__

    def sampler_iter(self):
        event("sampler_iter", sampler=id(self), shuffle=bool(self.shuffle), epoch=int(self.epoch))
        return original_iter(self)

    DistributedSampler.__iter__ = sampler_iter

    # save-on-every-rank, load-without-map-location, weights-only-off.
    original_save, original_load = torch.save, torch.load

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):  # a buffer in memory is nobody's file
            event("save", path=os.fspath(f))  # as the script names it: the ranks share a directory
        return original_save(obj, f, *args, **kwargs)

    def load(f, map_location=None, *args, weights_only=None, **kwargs):
        where = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<a file object>"
        event("load", path=where, map_location=map_location is not None, weights_only=weights_only)
        return original_load(f, map_location, *args, weights_only=weights_only, **kwargs)

    torch.save, torch.load = save, load

    # collectives-differ: the script's own calls, as it makes them (torch's internal calls go through
    # distributed_c10d's globals, which are left alone, so all_gather_object is one event, not two).
    def describe(value):
        if isinstance(value, torch.Tensor):
            return [list(value.shape), str(value.dtype).replace("torch.", "")]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return [describe(v) for v in value]
        return None  # objects (all_gather_object...): only the op and the count can be compared

    def instrument(name):
        original = getattr(dist, name)

        def collective(*args, **kwargs):
            first = args[0] if args else next(iter(kwargs.values()), None)
            event("collective", op=name, shape=describe(first) if not name.endswith("_object")
                  and not name.endswith("_object_list") else None)
            return original(*args, **kwargs)

        collective.__wrapped__ = original
        setattr(dist, name, collective)

    for name in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                 "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
                 "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
        if hasattr(dist, name):
            instrument(name)

    # params-diverged: every DDP-wrapped module, so its parameters can be written at exit.
    wrapped = []
    original_init = DistributedDataParallel.__init__

    def ddp_init(self, module, *args, **kwargs):
        original_init(self, module, *args, **kwargs)
        wrapped.append(self.module)  # held: a model local to main() is gone by exit

    DistributedDataParallel.__init__ = ddp_init

    def at_exit():
        modules = wrapped
        if modules:
            params = {f"ddp{i}.{name}": p.detach().float().cpu() for i, m in enumerate(modules)
                      for name, p in m.named_parameters()}
            original_save(params, os.path.join(out_dir, f"rank{rank}.params.pt"))
        # no-destroy: a group still up at exit was never destroyed.
        event("exit", initialized=dist.is_available() and dist.is_initialized(), ddp_modules=len(modules))
        log.close()
        gc.collect()  # DDP's reference cycle, and the process group it holds, go while Python is still whole

    atexit.register(at_exit)


def _activate():
    out_dir = os.environ.get("LESSONS_DOCTOR_DIR")
    if not out_dir or "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return  # not the doctor's launch, or torchrun's agent
    owner = os.environ.get("LESSONS_DOCTOR_RANK_PID")
    if owner and owner != str(os.getpid()):
        return  # a process the rank started: it inherits the environment, not the job
    os.environ["LESSONS_DOCTOR_RANK_PID"] = str(os.getpid())
    try:
        _install(out_dir, int(os.environ["RANK"]))
    except Exception as error:  # the instruments must never be why a script fails
        with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.error"), "w") as f:
            f.write(f"{type(error).__name__}: {error}\n")


_activate()
