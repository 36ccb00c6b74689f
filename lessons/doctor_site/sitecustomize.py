"""The DDP doctor's instruments (lessons/doctor.py), loaded into every rank by Python itself.

The doctor puts this directory first on the ranks' PYTHONPATH, so Python imports this file at start-up, before the
script. It records what the rank does into LESSONS_DOCTOR_DIR/rank<R>.jsonl, one JSON event per line, written as it
happens (a rank that hangs and is killed has still written what it did). Every event names the script's line that
caused it ("site": the first frame outside torch and this file). It is inert in torchrun's agent (no RANK), without
LESSONS_DOCTOR_DIR, and in any process a rank starts (DataLoader workers, compile workers).

What it records, and why (lessons/doctor.py turns it into findings):
- samplers and loaders as they are made (the data set's fingerprint, num_replicas, rank, the batch size), and each
  pass over a loader with the indices it drew: which ranks trained on which samples, at which epoch;
- optimizer steps, counted in every batch event: a pass during which the optimizer stepped is a *training* pass
  (an evaluation pass, or an extra next(iter(loader)), is not);
- the script's own collectives (not torch's internal ones), saves, loads (with where the file's tensors were saved
  from), init_process_group's rank, DDP/FSDP wrappers, mp.spawn;
- at exit, every optimizer's parameters (and each DDP module's), to compare between ranks and with one process.
"""
import os
import sys

_THIS_FILE = os.path.abspath(__file__)
INDICES_PER_PASS = 200_000  # the indices kept of one pass: enough to compare ranks, bounded for a huge data set
RECORDED_PASSES = 4  # per loader site: the first passes are enough to see who drew what


def _install(out_dir, rank):
    import atexit
    import gc
    import hashlib
    import json

    import torch
    import torch.distributed as dist
    # Not an instrument: the course's teardown fix (ddp_scripts/ddp_common.py, appendix section 5), so that a
    # script's rare abort at exit (a gloo thread meeting Python's shutdown) never fails the doctor's launch. Imported
    # here, before the script's init_process_group; the garbage is collected in at_exit below.
    import torch.distributed.nn  # noqa: F401
    import torch.optim.optimizer as optimizer_module
    import torch.utils.data.dataloader as dataloader_module
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    log = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", buffering=1)  # line-buffered: survives a kill
    state = {"steps": 0, "objects": 0, "last_rng": None, "new_pass": True, "rng_per_step": False}

    def event(what, **fields):
        log.write(json.dumps({"event": what, **fields}) + "\n")

    def site(skip_torch=True):
        """file:line of the first frame that is the script's (or a library's), not torch's or this file's."""
        frame = sys._getframe(1)
        while frame is not None:
            name = os.path.abspath(frame.f_code.co_filename)
            if name != _THIS_FILE and not (skip_torch and name.startswith(torch_dir)) \
                    and not frame.f_code.co_filename.startswith("<frozen"):
                return f"{shown_path(name)}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def called_from_torch():
        """True when the caller of our wrapper is torch itself (SyncBatchNorm, DDP's join, DCP...)."""
        frame = sys._getframe(2)
        return frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(torch_dir)

    def new_id():
        state["objects"] += 1
        return state["objects"]

    # --- data: data sets, samplers, loaders, passes -------------------------------------------------------------
    def digest_tensor(t, h):
        t = t.detach()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        flat = t.reshape(-1)[: 1 << 18].cpu().contiguous()  # the first 256k elements: enough to tell data sets apart
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.dtype != torch.bool else flat.numpy().tobytes())

    def fingerprint(dataset, depth=0, read_samples=False):
        """What identifies a data set: a Subset's indices, a TensorDataset's tensors; with read_samples, two of
        its samples (for a loader without worker processes: a sample read here, before they fork, could open a
        file the workers then share)."""
        if depth > 5:
            return type(dataset).__name__
        h = hashlib.sha256(type(dataset).__name__.encode())
        try:
            h.update(str(len(dataset)).encode())
        except Exception:  # noqa: BLE001  an iterable data set has no length
            pass
        if isinstance(dataset, torch.utils.data.Subset):
            h.update(json.dumps([int(i) for i in dataset.indices]).encode())
            h.update(fingerprint(dataset.dataset, depth + 1, read_samples).encode())
        elif isinstance(dataset, torch.utils.data.TensorDataset):
            for t in dataset.tensors:
                digest_tensor(t, h)
        elif isinstance(dataset, torch.utils.data.ConcatDataset):
            for d in dataset.datasets:
                h.update(fingerprint(d, depth + 1, read_samples).encode())
        elif read_samples and hasattr(dataset, "__getitem__") \
                and not isinstance(dataset, torch.utils.data.IterableDataset):
            h.update(samples_digest(dataset).encode())
        return h.hexdigest()[:16]

    def digest_value(value, h, depth=0):
        if isinstance(value, torch.Tensor):
            digest_tensor(value, h)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for v in value:
                digest_value(v, h, depth + 1)
        elif depth < 4 and isinstance(value, dict):
            for k in sorted(value, key=str):
                h.update(str(k).encode())
                digest_value(value[k], h, depth + 1)
        elif isinstance(value, (int, float, str, bytes, bool)) or value is None:
            h.update(repr(value).encode())
        elif hasattr(value, "tobytes"):  # a NumPy array, a PIL image
            h.update(value.tobytes()[: 1 << 20])
        else:
            h.update(type(value).__name__.encode())

    def samples_digest(dataset):
        """The first and the last sample, each read twice: a sample that reads differently twice (a random
        augmentation) can't tell data sets apart, and says nothing. The random states are put back as they were:
        the script's own random numbers must not change because the doctor looked."""
        import random
        try:
            length = len(dataset)
        except Exception:  # noqa: BLE001
            return ""
        if not length:
            return ""
        numpy = sys.modules.get("numpy")
        saved = (torch.get_rng_state(), random.getstate(), numpy.random.get_state() if numpy else None)
        try:
            reads = []
            for index in (0, length - 1, 0, length - 1):
                h = hashlib.sha256()
                digest_value(dataset[index], h)
                reads.append(h.hexdigest())
        except Exception:  # noqa: BLE001  a sample that can't be read here (a missing file): say nothing
            return ""
        finally:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            if numpy:
                numpy.random.set_state(saved[2])
        return "".join(reads[:2]) if reads[:2] == reads[2:] else ""

    original_sampler_init = DistributedSampler.__init__

    def sampler_init(self, dataset, *args, **kwargs):
        original_sampler_init(self, dataset, *args, **kwargs)
        self._doctor_id = new_id()
        event("sampler", sampler=self._doctor_id, site=site(), num_replicas=int(self.num_replicas),
              rank=int(self.rank), shuffle=bool(self.shuffle), seed=int(self.seed), drop_last=bool(self.drop_last),
              dataset=fingerprint(dataset), length=len(dataset))

    DistributedSampler.__init__ = sampler_init

    override = json.loads(os.environ.get("LESSONS_DOCTOR_BATCH", "null"))  # --compare: {"site": s, "batch": b}
    original_loader_init = DataLoader.__init__

    def loader_init(self, dataset, *args, **kwargs):
        where = site()
        asked = kwargs.get("batch_size", args[0] if args else 1)
        if override and where == override["site"] and asked is not None and asked != override["batch"]:
            if args:
                args = (override["batch"], *args[1:])
            else:
                kwargs["batch_size"] = override["batch"]
        original_loader_init(self, dataset, *args, **kwargs)
        self._doctor_id, self._doctor_passes = new_id(), 0
        sampler = self.sampler if isinstance(self.sampler, DistributedSampler) else None
        try:
            length = len(dataset)
        except Exception:  # noqa: BLE001
            length = None
        event("loader", loader=self._doctor_id, site=where, batch_size=self.batch_size, asked_batch_size=asked,
              sampler=getattr(sampler, "_doctor_id", None), sampler_type=type(self.sampler).__name__,
              batch_sampler=type(self.batch_sampler).__name__ if self.batch_sampler is not None else None,
              dataset=fingerprint(dataset, read_samples=self.num_workers == 0), length=length,
              drop_last=bool(self.drop_last))

    DataLoader.__init__ = loader_init

    original_iter_init = dataloader_module._BaseDataLoaderIter.__init__
    original_next_index = dataloader_module._BaseDataLoaderIter._next_index
    original_next = dataloader_module._BaseDataLoaderIter.__next__

    def iter_init(self, loader, *args, **kwargs):
        original_iter_init(self, loader, *args, **kwargs)
        loader_id = getattr(loader, "_doctor_id", None)
        if loader_id is None:
            self._doctor = None
            return
        loader._doctor_passes += 1
        sampler = loader.sampler if isinstance(loader.sampler, DistributedSampler) else None
        self._doctor = {"loader": loader_id, "pass": loader._doctor_passes, "batches": 0, "indices": [],
                        "record": loader._doctor_passes <= RECORDED_PASSES}
        state["new_pass"] = True
        event("pass", loader=loader_id, number=loader._doctor_passes, site=site(), steps=state["steps"],
              sampler=getattr(sampler, "_doctor_id", None), epoch=int(sampler.epoch) if sampler else None)

    def next_index(self):
        index = original_next_index(self)
        doctor = getattr(self, "_doctor", None)
        if doctor is not None and doctor["record"] and len(doctor["indices"]) < INDICES_PER_PASS:
            try:  # a map-style data set's indices; an iterable one's are None, a custom sampler's anything
                doctor["indices"].extend(int(i) for i in (index if isinstance(index, (list, tuple)) else [index]))
            except (TypeError, ValueError):
                doctor["record"], doctor["indices"] = False, []
        return index

    def next_batch(self):
        doctor = getattr(self, "_doctor", None)
        try:
            batch = original_next(self)
        except StopIteration:
            if doctor is not None and not doctor.get("ended"):
                doctor["ended"] = True
                pass_end(doctor)
            raise
        if doctor is not None:
            doctor["batches"] += 1
            event("batch", loader=doctor["loader"], number=doctor["pass"], n=doctor["batches"], steps=state["steps"])
        return batch

    def pass_end(doctor):
        indices = doctor["indices"] if doctor["record"] else None
        event("pass_end", loader=doctor["loader"], number=doctor["pass"], batches=doctor["batches"],
              steps=state["steps"], indices=indices)

    dataloader_module._BaseDataLoaderIter.__init__ = iter_init
    dataloader_module._BaseDataLoaderIter._next_index = next_index
    dataloader_module._BaseDataLoaderIter.__next__ = next_batch

    # --- optimizers: steps, and the parameters to compare at exit ---------------------------------------------
    optimizers = []  # held: a model local to main() is gone by exit
    original_optimizer_init = torch.optim.Optimizer.__init__

    def optimizer_init(self, params, *args, **kwargs):
        original_optimizer_init(self, params, *args, **kwargs)
        if not hasattr(self, "_doctor_id"):  # a subclass's __init__ may call this more than once
            self._doctor_id = new_id()
            optimizers.append(self)
            event("optimizer", optimizer=self._doctor_id, site=site(), kind=type(self).__name__)

    torch.optim.Optimizer.__init__ = optimizer_init
    first_params = {}

    def before_step(optimizer, args, kwargs):
        if os.environ.get("LESSONS_DOCTOR_COMPARE") and optimizer in optimizers and not first_params.get(id(optimizer)):
            first_params[id(optimizer)] = [p.detach().float().cpu().clone() for g in optimizer.param_groups
                                           for p in g["params"]]

    after_first = {}

    def after_step(optimizer, args, kwargs):
        state["steps"] += 1
        if os.environ.get("LESSONS_DOCTOR_COMPARE") and optimizer in optimizers and id(optimizer) not in after_first:
            after_first[id(optimizer)] = [p.detach().float().cpu().clone() for g in optimizer.param_groups
                                          for p in g["params"]]
        rng = hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()
        if state["last_rng"] is not None and not state["new_pass"] and rng != state["last_rng"]:
            if not state["rng_per_step"]:
                state["rng_per_step"] = True
                event("rng_per_step", site=site(), steps=state["steps"])
        state["last_rng"], state["new_pass"] = rng, False

    optimizer_module.register_optimizer_step_pre_hook(before_step)
    optimizer_module.register_optimizer_step_post_hook(after_step)

    # --- wrappers: DDP, FSDP ---------------------------------------------------------------------------------
    wrapped = []
    original_ddp_init = DistributedDataParallel.__init__

    def ddp_init(self, module, *args, **kwargs):
        original_ddp_init(self, module, *args, **kwargs)
        wrapped.append(self.module)
        event("wrapper", kind="DistributedDataParallel", site=site())

    DistributedDataParallel.__init__ = ddp_init
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        original_fsdp_init = FullyShardedDataParallel.__init__

        def fsdp_init(self, *args, **kwargs):
            original_fsdp_init(self, *args, **kwargs)
            event("wrapper", kind="FullyShardedDataParallel", site=site())

        FullyShardedDataParallel.__init__ = fsdp_init
    except Exception:  # noqa: BLE001  an old or a CPU-less build
        pass
    for module_name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = __import__(module_name, fromlist=["fully_shard"])
            original_fully_shard = module.fully_shard
        except Exception:  # noqa: BLE001
            continue

        def fully_shard(*args, _original=original_fully_shard, **kwargs):
            if not called_from_torch():
                event("wrapper", kind="fully_shard", site=site())
            return _original(*args, **kwargs)

        module.fully_shard = fully_shard

    # --- the process group: the rank it was given, collectives, the end ---------------------------------------
    original_init_group = dist.init_process_group

    def init_process_group(*args, **kwargs):
        given = kwargs.get("rank", args[4] if len(args) > 4 else -1)
        event("init", site=site(), rank_given=None if given in (None, -1) else int(given),
              env_rank=int(os.environ["RANK"]), local_rank=int(os.environ["LOCAL_RANK"]),
              world_size=int(os.environ.get("WORLD_SIZE", "1")))
        return original_init_group(*args, **kwargs)

    dist.init_process_group = init_process_group

    def describe(value):
        if isinstance(value, torch.Tensor):
            return [list(value.shape), str(value.dtype).replace("torch.", "")]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return [describe(v) for v in value]
        return None  # objects (all_gather_object...): only the op and the count can be compared

    def instrument(name):
        original = getattr(dist, name)

        def collective(*args, **kwargs):
            if not called_from_torch():  # SyncBatchNorm, DDP's join, DCP: torch's own calls, not the script's
                first = args[0] if args else next(iter(kwargs.values()), None)
                event("collective", op=name, site=site(), shape=None if "_object" in name else describe(first),
                      steps=state["steps"])
            return original(*args, **kwargs)

        collective.__wrapped__ = original
        setattr(dist, name, collective)

    for name in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                 "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
                 "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
        if hasattr(dist, name):
            instrument(name)

    # --- files: who saves, and where a load puts the tensors ---------------------------------------------------
    original_save, original_load = torch.save, torch.load

    def devices_in(obj, found, depth=0):
        if isinstance(obj, torch.Tensor):
            found.add(str(obj.device))
        elif depth < 6 and isinstance(obj, dict):
            for value in obj.values():
                devices_in(value, found, depth + 1)
        elif depth < 6 and isinstance(obj, (list, tuple)):
            for value in obj:
                devices_in(value, found, depth + 1)
        return found

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):  # a buffer in memory is nobody's file
            event("save", path=os.fspath(f), site=site(), devices=sorted(devices_in(obj, set())))
        return original_save(obj, f, *args, **kwargs)

    def saved_locations(f):
        """Where the file's storages were saved from ("cpu", "cuda:0"), read with a map_location that only
        records; None when the file can't be read so (not a path, not weights only)."""
        if not isinstance(f, (str, os.PathLike)):
            return None
        seen = set()

        def record(storage, location):
            seen.add(location)
            return storage

        try:  # mmap: the storages are mapped, not read (a second read of a big file would cost its size)
            original_load(f, map_location=record, weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001  an old (non-zip) file can't be mapped; one with objects isn't weights only
            try:
                seen.clear()
                original_load(f, map_location=record, weights_only=True)
            except Exception:  # noqa: BLE001
                return None
        return sorted(seen)

    def map_location_text(map_location):
        if map_location is None:
            return None
        if isinstance(map_location, dict):
            return {"dict": {str(k): str(v) for k, v in map_location.items()}}
        if callable(map_location) and not isinstance(map_location, (str, torch.device)):
            return "a function"
        return str(map_location)

    def load(f, map_location=None, *args, weights_only=None, **kwargs):
        where = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<a file object>"
        event("load", path=where, site=site(), map_location=map_location_text(map_location),
              weights_only=weights_only,
              saved_from=saved_locations(f) if map_location is None or isinstance(map_location, dict) else None)
        return original_load(f, map_location, *args, weights_only=weights_only, **kwargs)

    torch.save, torch.load = save, load

    # --- mp.spawn under torchrun: every rank would start its own world -----------------------------------------
    import torch.multiprocessing as torch_mp

    def refuse(name):
        def spawn(*args, **kwargs):
            event("spawn", site=site(), call=name)
            raise RuntimeError(
                f"DDP doctor: this script starts its own ranks ({name}) while torchrun has already started"
                f" {os.environ.get('WORLD_SIZE', '?')}: run it with python (the doctor's torchrun can't), or drop"
                " the spawn and read RANK, LOCAL_RANK and WORLD_SIZE from the environment")
        return spawn

    torch_mp.spawn, torch_mp.start_processes = refuse("torch.multiprocessing.spawn"), refuse("start_processes")

    # --- at exit ----------------------------------------------------------------------------------------------
    def at_exit():
        params = {}
        for i, optimizer in enumerate(optimizers):
            tensors = [p for g in optimizer.param_groups for p in g["params"]]
            if any(type(p.data).__name__ == "DTensor" or type(p).__name__ == "DTensor" for p in tensors):
                continue  # shards: each rank holds its own part, nothing to compare
            for j, p in enumerate(tensors):
                params[f"opt{i}.{j}"] = p.detach().float().cpu()
            for j, p in enumerate(first_params.get(id(optimizer), [])):
                params[f"start.opt{i}.{j}"] = p
            for j, p in enumerate(after_first.get(id(optimizer), [])):
                params[f"first.opt{i}.{j}"] = p
        for i, module in enumerate(wrapped):
            for name, p in module.named_parameters():
                params[f"ddp{i}.{name}"] = p.detach().float().cpu()
        if params:
            original_save(params, os.path.join(out_dir, f"rank{rank}.params.pt"))
        event("exit", initialized=dist.is_available() and dist.is_initialized(), steps=state["steps"],
              optimizers=len(optimizers), ddp_modules=len(wrapped), rng_per_step=state["rng_per_step"])
        log.close()
        gc.collect()  # DDP's reference cycle, and the process group it holds, go while Python is still whole

    atexit.register(at_exit)


def shown_path(name):
    """A path as the script's reader knows it: relative to the working directory (the script's own
    "../ddp_scripts/x.py" too), absolute when that would climb more than one folder (a library's file, /tmp)."""
    try:
        relative = os.path.relpath(name)
    except ValueError:  # another drive
        return name
    return name if relative.startswith(os.path.join("..", "..")) else relative


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
