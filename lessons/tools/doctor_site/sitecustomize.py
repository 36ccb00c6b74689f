"""The DDP doctor's instruments (lessons/tools/doctor.py), loaded into every rank by Python itself.

The doctor puts this directory first on the ranks' PYTHONPATH, so Python imports this file at start-up, before the
script. It records what the rank does into LESSONS_DOCTOR_DIR/rank<R>.jsonl, one JSON event per line, written as it
happens (a rank that hangs and is killed has still written what it did); lessons/tools/doctor_events.py describes every
event. Every event names the script's line that caused it ("site": the first frame outside torch and this file). It
is inert in torchrun's agent (no RANK), without LESSONS_DOCTOR_DIR, and in any process a rank starts (DataLoader
workers, compile workers).

It must not change the run it watches: every callable it replaces keeps the original's signature, name and
attributes (functools.wraps), because libraries read them (Lightning rebuilds a DataLoader from the parameters of
DataLoader.__init__'s signature). One installer per area: data, optimizers, wrappers, the process group and its
collectives, files, the end.

What it records, and why (lessons/tools/doctor_rules.py and its areas turn it into findings):
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
            if name != _THIS_FILE and not (skip_torch and name.startswith(self.torch_dir)) \
                    and not frame.f_code.co_filename.startswith("<frozen"):
                return f"{shown_path(name)}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def made_by_torch(self):
        """True when torch itself made the object under construction (ZeroRedundancyOptimizer's inner optimizer):
        the first frame outside torch.optim's classes and this file is another part of torch."""
        frame = sys._getframe(2)
        optim_dir = self.torch_dir + "optim" + os.sep
        while frame is not None and (os.path.abspath(frame.f_code.co_filename) == _THIS_FILE
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


# --- data: data sets, samplers, loaders, passes ----------------------------------------------------------------------

def _install_data(rec):
    import hashlib
    import json

    import torch
    import torch.utils.data.dataloader as dataloader_module
    from torch.utils.data import DataLoader, DistributedSampler

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
        else:  # a data set of the script's own: what it was made from (a shard's file, a rank), and its samples
            digest_attributes(dataset, h)
            if read_samples and hasattr(dataset, "__getitem__") \
                    and not isinstance(dataset, torch.utils.data.IterableDataset):
                h.update(samples_digest(dataset).encode())
        return h.hexdigest()[:16]

    def digest_attributes(dataset, h):
        """The data set's plain attributes (paths, numbers, names, their lists: the first 1000 items and the length),
        which tell apart pre-sharded data sets whose samples are read only in DataLoader workers."""
        plain = (str, bytes, int, float, bool, os.PathLike)
        for name, value in sorted(getattr(dataset, "__dict__", {}).items()):
            if isinstance(value, plain):
                h.update(f"{name}={value!r}".encode())
            elif isinstance(value, torch.Tensor) or type(value).__name__ == "ndarray":
                # held in memory (a rank's shard loaded at start): its values are read here, no file is opened
                h.update(name.encode())
                digest_value(value, h)
            elif isinstance(value, (list, tuple)):
                h.update(f"{name}:{len(value)}".encode())
                for item in value[:1000]:
                    if isinstance(item, plain) or isinstance(item, tuple) and all(isinstance(i, plain) for i in item):
                        h.update(repr(item).encode())
                    elif isinstance(item, torch.Tensor):
                        digest_tensor(item, h)

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
        elif type(value).__name__ == "ndarray":  # the first 256k elements, as of a tensor: never a copy of all
            h.update(str((value.shape, str(value.dtype))).encode())
            h.update(value.reshape(-1)[: 1 << 18].tobytes())
        elif hasattr(value, "tobytes"):  # a PIL image
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

    def sampler_init(original):
        def __init__(self, dataset, *args, **kwargs):
            original(self, dataset, *args, **kwargs)
            self._doctor_id = rec.new_id()
            rec.event("sampler", sampler=self._doctor_id, site=rec.site(), num_replicas=int(self.num_replicas),
                      rank=int(self.rank), shuffle=bool(self.shuffle), seed=int(self.seed),
                      drop_last=bool(self.drop_last), dataset=fingerprint(dataset), length=len(dataset))
        return __init__

    _replace(DistributedSampler, "__init__", sampler_init)

    override = json.loads(os.environ.get("LESSONS_DOCTOR_BATCH", "null"))  # --compare: {"site": s, "batch": b}
    # --compare, a loader that takes a batch_sampler: the ranks' batches, step by step, as one process's
    # {"site": s, "ordinal": k (the k-th loader made there), "passes": [[[i...]...]...]}
    union = json.loads(os.environ.get("LESSONS_DOCTOR_BATCHES", "null"))
    union_made = {}

    class RanksBatches:
        """The one process's batch_sampler: each pass, the union of the ranks' batches of that pass."""

        def __init__(self, passes, replaced):
            self.passes, self.number, self.replaced = passes, 0, replaced

        def __iter__(self):
            self.number += 1
            return iter(self.passes[min(self.number, len(self.passes)) - 1])

        def __len__(self):
            return len(self.passes[min(max(self.number, 1), len(self.passes)) - 1])

        def __getattr__(self, name):  # set_epoch, sampler, batch_size...: the replaced one's
            return getattr(self.__dict__["replaced"], name)

    def loader_init(original):
        def __init__(self, dataset, *args, **kwargs):
            where = rec.site()
            asked = kwargs.get("batch_size", args[0] if args else 1)
            # A loader given a batch_sampler has no batch size to change (Lightning rebuilds its predict loader at
            # the same line as the training loader): changing it would raise in the DataLoader.
            by_batch_sampler = kwargs.get("batch_sampler") is not None or len(args) > 3 and args[3] is not None
            made_here = union_made[where] = union_made.get(where, -1) + 1  # the k-th loader made at this line
            if union and where == union["site"] and by_batch_sampler and made_here == union.get("ordinal", 0):
                if kwargs.get("batch_sampler") is not None:
                    kwargs["batch_sampler"] = RanksBatches(union["passes"], kwargs["batch_sampler"])
                else:
                    args = (*args[:3], RanksBatches(union["passes"], args[3]), *args[4:])
            if override and where == override["site"] and asked is not None and asked != override["batch"] \
                    and not by_batch_sampler:
                if args:
                    args = (override["batch"], *args[1:])
                else:
                    kwargs["batch_size"] = override["batch"]
            original(self, dataset, *args, **kwargs)
            self._doctor_id, self._doctor_passes = rec.new_id(), 0
            sampler = self.sampler if isinstance(self.sampler, DistributedSampler) else None
            try:
                length = len(dataset)
            except Exception:  # noqa: BLE001
                length = None
            rec.event("loader", loader=self._doctor_id, site=where, batch_size=self.batch_size,
                      asked_batch_size=asked, sampler=getattr(sampler, "_doctor_id", None),
                      sampler_type=type(self.sampler).__name__,
                      batch_sampler=type(self.batch_sampler).__name__ if self.batch_sampler is not None else None,
                      dataset=fingerprint(dataset, read_samples=self.num_workers == 0), length=length,
                      drop_last=bool(self.drop_last))
        return __init__

    _replace(DataLoader, "__init__", loader_init)

    def start_pass(iterator, loader):
        loader_id = getattr(loader, "_doctor_id", None)
        if loader_id is None:
            iterator._doctor = None
            return
        left = rec.open_passes.pop(loader_id, None)
        if left is not None and not left.get("ended"):  # a loop that stops by counting (Lightning's limit_*_batches,
            left["ended"] = True  # a break) never reaches StopIteration: its pass ends when the next one starts
            pass_end(left, complete=False)
        loader._doctor_passes += 1
        sampler = loader.sampler if isinstance(loader.sampler, DistributedSampler) else None
        iterator._doctor = {"loader": loader_id, "pass": loader._doctor_passes, "batches": 0, "indices": [],
                            "sizes": [], "record": loader._doctor_passes <= RECORDED_PASSES}
        rec.open_passes[loader_id] = iterator._doctor
        rec.new_pass = True
        rec.event("pass", loader=loader_id, number=loader._doctor_passes, site=rec.site(), steps=rec.steps,
                  sampler=getattr(sampler, "_doctor_id", None), epoch=int(sampler.epoch) if sampler else None,
                  joined=rec.joined > 0)

    def iter_init(original):
        def __init__(self, loader, *args, **kwargs):
            original(self, loader, *args, **kwargs)
            start_pass(self, loader)
        return __init__

    def iter_reset(original):
        """persistent_workers=True: one iterator for the loader's life, reset for each pass after the first."""
        def _reset(self, loader, first_iter=False):
            original(self, loader, first_iter)
            if not first_iter:
                doctor = getattr(self, "_doctor", None)
                if doctor is not None and not doctor.get("ended"):  # the last pass was left before its end
                    doctor["ended"] = True
                    pass_end(doctor, complete=False)
                start_pass(self, loader)
        return _reset

    def next_index(original):
        def _next_index(self):
            index = original(self)
            doctor = getattr(self, "_doctor", None)
            if doctor is not None and doctor["record"] and len(doctor["indices"]) < INDICES_PER_PASS:
                try:  # a map-style data set's indices; an iterable one's are None, a custom sampler's anything
                    batch = index if isinstance(index, (list, tuple)) else [index]
                    doctor["indices"].extend(int(i) for i in batch)
                    doctor["sizes"].append(len(batch))
                except (TypeError, ValueError):
                    doctor["record"], doctor["indices"], doctor["sizes"] = False, [], []
            return index
        return _next_index

    def pass_end(doctor, complete=True):
        indices = doctor["indices"] if doctor["record"] else None
        rec.event("pass_end", loader=doctor["loader"], number=doctor["pass"], batches=doctor["batches"],
                  steps=rec.steps, indices=indices, batch_sizes=doctor["sizes"] if doctor["record"] else None,
                  complete=complete)

    def passes_left_open(params):
        """At exit: the passes never run to their end (or to a next pass), with the samples they drew."""
        for doctor in list(rec.open_passes.values()):
            if not doctor.get("ended"):
                doctor["ended"] = True
                pass_end(doctor, complete=False)

    rec.at_exit.append(passes_left_open)

    def next_batch(original):
        def __next__(self):
            doctor = getattr(self, "_doctor", None)
            try:
                batch = original(self)
            except StopIteration:
                if doctor is not None and not doctor.get("ended"):
                    doctor["ended"] = True
                    pass_end(doctor)
                raise
            if rec.steps == 0:  # the random state the first step's forward starts from (its dropout masks)
                rec.rng_first_batch = rec.rng_digest()
            if doctor is not None:
                doctor["batches"] += 1
                rec.event("batch", loader=doctor["loader"], number=doctor["pass"], n=doctor["batches"],
                          steps=rec.steps)
            return batch
        return __next__

    base_iter = dataloader_module._BaseDataLoaderIter
    _replace(base_iter, "__init__", iter_init)
    _replace(dataloader_module._MultiProcessingDataLoaderIter, "_reset", iter_reset)
    _replace(base_iter, "_next_index", next_index)
    _replace(base_iter, "__next__", next_batch)


# --- optimizers: steps, and the parameters to compare at exit --------------------------------------------------------

def _install_optimizers(rec):
    import torch
    import torch.optim.optimizer as optimizer_module

    def optimizer_init(original):
        def __init__(self, params, *args, **kwargs):
            original(self, params, *args, **kwargs)
            if not hasattr(self, "_doctor_id") and not rec.made_by_torch():  # ZeRO's inner optimizer: torch's
                self._doctor_id = rec.new_id()
                rec.optimizers.append(self)
                rec.event("optimizer", optimizer=self._doctor_id, site=rec.site(), kind=type(self).__name__)
        return __init__

    _replace(torch.optim.Optimizer, "__init__", optimizer_init)
    comparing = bool(os.environ.get("LESSONS_DOCTOR_COMPARE"))

    def parameters(optimizer):
        return [p.detach().float().cpu().clone() for g in optimizer.param_groups for p in g["params"]]

    import weakref
    in_a_module = {}  # id -> a weak reference, of every parameter a module registered: a model's, not a tensor of
    # its own (a WeakSet would compare tensors with ==, element by element)

    def registered(module, name, param):
        if param is not None:
            in_a_module[id(param)] = weakref.ref(param)

    def is_registered(p):
        ref = in_a_module.get(id(p))
        return ref is not None and ref() is p

    torch.nn.modules.module.register_module_parameter_registration_hook(registered)
    rec.first_lrs = {}  # each optimizer's learning rates at its first step (after a scheduler's first change)
    rec.first_sums = {}  # each optimizer's parameters after its first step, as (sum, sum of |x|) a tensor
    rec.travelled = 0.0  # --compare: the sum over the steps of each step's largest change of a parameter
    before = {}

    def before_step(optimizer, args, kwargs):
        if comparing and optimizer in rec.optimizers and not rec.first_params.get(id(optimizer)):
            rec.first_params[id(optimizer)] = parameters(optimizer)
        if optimizer in rec.optimizers and id(optimizer) not in rec.first_lrs:
            rec.first_lrs[id(optimizer)] = [float(g["lr"]) for g in optimizer.param_groups if "lr" in g]
        if comparing and optimizer in rec.optimizers:
            before[id(optimizer)] = [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]

    def after_step(optimizer, args, kwargs):
        rec.steps += 1
        if comparing and optimizer in rec.optimizers and id(optimizer) not in rec.after_first:
            rec.after_first[id(optimizer)] = parameters(optimizer)
        if optimizer in rec.optimizers and id(optimizer) not in rec.first_sums:
            # Two numbers a tensor, once: replicas agree after their first step; separate models part there.
            with torch.no_grad():
                rec.first_sums[id(optimizer)] = [
                    [p.detach().double().sum().item(), p.detach().double().abs().sum().item()]
                    for g in optimizer.param_groups for p in g["params"]]
        if comparing and id(optimizer) in before:
            now = [p.detach() for g in optimizer.param_groups for p in g["params"]]
            with torch.no_grad():
                rec.travelled += max([(a.float() - b.float()).abs().max().item() for a, b in
                                      zip(now, before.pop(id(optimizer))) if a.numel() and a.shape == b.shape]
                                     or [0.0])
        rng = rec.rng_digest()
        if rec.rng_first_step is None:
            rec.rng_first_step = rng
        if rec.last_rng is not None and not rec.new_pass and rng != rec.last_rng and not rec.rng_per_step:
            rec.rng_per_step = True
            rec.event("rng_per_step", site=rec.site(), steps=rec.steps)
        rec.last_rng, rec.new_pass = rng, False

    optimizer_module.register_optimizer_step_pre_hook(before_step)
    optimizer_module.register_optimizer_step_post_hook(after_step)

    def what_it_is(p, sharded):
        """A parameter by what it is: "opt" a model's parameter, the same on every rank where the model is
        replicated; "flat" a FullyShardedDataParallel flat parameter's shard (each rank its part of one flat
        vector, in rank order); "own" each rank's own by design: a DTensor's local shard, a parameter of a module
        FSDP shards, a tensor that is no module's parameter (ZeRO's partition written by hand)."""
        if type(p.data).__name__ == "DTensor" or type(p).__name__ == "DTensor":
            return None  # its local shard is the rank's own, and nothing to compare
        if getattr(p, "_is_flat_param", False):
            return "flat"
        if id(p) in sharded or not is_registered(p):
            return "own"
        return "opt"

    def parameters_at_exit(params):
        sharded = rec.sharded_ids()  # the parameters of the modules FSDP wraps, once
        for i, optimizer in enumerate(rec.optimizers):
            tensors = [p for g in optimizer.param_groups for p in g["params"]]
            kinds = [what_it_is(p, sharded) for p in tensors]
            if None in kinds:
                continue  # shards: each rank holds its own part, nothing to compare
            for j, (p, kind) in enumerate(zip(tensors, kinds)):
                params[f"opt{i}.{j}" if kind == "opt" else f"{kind}.opt{i}.{j}"] = p.detach().float().cpu()
            for j, p in enumerate(rec.first_params.get(id(optimizer), [])):
                if kinds[j] == "opt":
                    params[f"start.opt{i}.{j}"] = p
            for j, p in enumerate(rec.after_first.get(id(optimizer), [])):
                if kinds[j] == "opt":
                    params[f"first.opt{i}.{j}"] = p
            sums = [row for row, kind in zip(rec.first_sums.get(id(optimizer), []), kinds) if kind == "opt"]
            if sums:
                params[f"firstsum.opt{i}"] = torch.tensor(sums, dtype=torch.float64)

    rec.at_exit.append(parameters_at_exit)


# --- wrappers: DDP, FSDP ---------------------------------------------------------------------------------------------

def _install_wrappers(rec):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    def ddp_init(original):
        def __init__(self, module, *args, **kwargs):
            original(self, module, *args, **kwargs)
            rec.wrapped.append(self.module)
            batch_norm = next((type(m).__name__ for m in self.module.modules() if isinstance(
                m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)), None)
            rec.event("wrapper", kind="DistributedDataParallel", site=rec.site(), dropout=random_layer(self.module),
                      batch_norm=batch_norm)
        return __init__

    _replace(DistributedDataParallel, "__init__", ddp_init)

    def random_layer(module):
        """The first layer that draws random numbers in training, as "Dropout(p=0.2)": dropout of p > 0, or a drop
        path (stochastic depth: timm's and DINO's DropPath, torchvision's StochasticDepth); None if none."""
        for m in module.modules():
            name = type(m).__name__
            if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                p = m.p
            elif name in ("DropPath", "StochasticDepth"):
                p = next((getattr(m, a) for a in ("drop_prob", "p") if isinstance(getattr(m, a, None), float)), 0.0)
            else:
                continue
            if p > 0:
                return f"{name}(p={p:g})"
        return None

    try:  # uneven batches inside Join (DDP's join(), Join([model, optimizer])) are handled by design
        from torch.distributed.algorithms.join import Join

        def join_enter(original):
            def __enter__(self):
                result = original(self)
                rec.joined += bool(getattr(self, "_enable", True))
                return result
            return __enter__

        def join_exit(original):
            def __exit__(self, *args):
                rec.joined -= bool(getattr(self, "_enable", True))
                return original(self, *args)
            return __exit__

        _replace(Join, "__enter__", join_enter)
        _replace(Join, "__exit__", join_exit)
    except Exception:  # noqa: BLE001  an old build
        pass

    seen_precisions = set()

    def autocast_enter(original):
        def __enter__(self):
            result = original(self)
            precision = (str(getattr(self, "device", "?")), str(getattr(self, "fast_dtype", "?")).replace("torch.", ""))
            if getattr(self, "_enabled", True) and precision not in seen_precisions:
                seen_precisions.add(precision)
                rec.event("autocast", device=precision[0], dtype=precision[1], site=rec.site())
            return result
        return __enter__

    _replace(torch.autocast, "__enter__", autocast_enter)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        def fsdp_init(original):
            def __init__(self, *args, **kwargs):
                original(self, *args, **kwargs)
                rec.sharded_modules.append(self)
                if not rec.called_from_torch():  # an auto-wrapped inner unit: torch's own call
                    rec.event("wrapper", kind="FullyShardedDataParallel", site=rec.site(),
                              dropout=random_layer(self), batch_norm=None)
            return __init__

        _replace(FullyShardedDataParallel, "__init__", fsdp_init)
    except Exception:  # noqa: BLE001  an old or a CPU-less build
        pass

    def fully_shard_call(original):
        def fully_shard(*args, **kwargs):
            module = args[0] if args else kwargs.get("module")
            if not rec.called_from_torch():
                rec.event("wrapper", kind="fully_shard", site=rec.site(), batch_norm=None,
                          dropout=random_layer(module) if isinstance(module, torch.nn.Module) else None)
            return original(*args, **kwargs)
        return fully_shard  # wrapped: keeps the original's attributes (fully_shard.state, which pipelining calls)

    for module_name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = __import__(module_name, fromlist=["fully_shard"])
            module.fully_shard  # noqa: B018  an old build has none
        except Exception:  # noqa: BLE001
            continue
        _replace(module, "fully_shard", fully_shard_call)

    def modules_at_exit(params):
        for i, module in enumerate(rec.wrapped):
            for name, p in module.named_parameters():
                params[f"ddp{i}.{name}"] = p.detach().float().cpu()

    rec.at_exit.append(modules_at_exit)


# --- the process group: the rank it was given, the script's own collectives, mp.spawn --------------------------------

def _install_process_group(rec):
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as torch_mp

    def init_call(original):
        def init_process_group(*args, **kwargs):
            given = kwargs.get("rank", args[4] if len(args) > 4 else -1)
            rec.event("init", site=rec.site(), rank_given=None if given in (None, -1) else int(given),
                      env_rank=int(os.environ["RANK"]), local_rank=int(os.environ["LOCAL_RANK"]),
                      world_size=int(os.environ.get("WORLD_SIZE", "1")))
            return original(*args, **kwargs)
        return init_process_group

    original_init = dist.init_process_group
    _replace(dist, "init_process_group", init_call)
    # torch's own modules that imported it by name (init_device_mesh's) call it too: the same wrapper there
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "init_process_group", None) is original_init:
            module.init_process_group = dist.init_process_group

    def describe(value):
        if isinstance(value, torch.Tensor):
            return [list(value.shape), str(value.dtype).replace("torch.", "")]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return [describe(v) for v in value]
        return None  # objects (all_gather_object...): only the op and the count can be compared

    def collective_call(name):
        def make(original):
            def collective(*args, **kwargs):
                if not rec.called_from_torch():  # SyncBatchNorm, DDP's join, DCP: torch's own calls, not the script's
                    first = args[0] if args else next(iter(kwargs.values()), None)
                    # all_to_all's tensors differ between ranks by design (uneven splits: mixture-of-experts routing)
                    rec.event("collective", op=name, site=rec.site(),
                              shape=None if "_object" in name or "all_to_all" in name else describe(first),
                              steps=rec.steps)
                return original(*args, **kwargs)
            return collective
        return make

    for name in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                 "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
                 "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"):
        if hasattr(dist, name):
            _replace(dist, name, collective_call(name))

    # mp.spawn under torchrun: every rank would start its own world. Refused when it is called, not when the word
    # is in the file: a script that spawns only under a flag (pytorch/examples' imagenet) runs under torchrun.
    def refuse(call):
        def make(original):
            def spawn(*args, **kwargs):
                rec.event("spawn", site=rec.site(), call=call)
                raise RuntimeError(
                    f"DDP doctor: this script starts its own ranks ({call}) while torchrun has already started"
                    f" {os.environ.get('WORLD_SIZE', '?')}: run it with python (the doctor's torchrun can't), or"
                    " drop the spawn and read RANK, LOCAL_RANK and WORLD_SIZE from the environment")
            return spawn
        return make

    _replace(torch_mp, "spawn", refuse("torch.multiprocessing.spawn"))
    _replace(torch_mp, "start_processes", refuse("start_processes"))


# --- files: who saves, and where a load puts the tensors --------------------------------------------------------------

def _install_files(rec):
    import torch

    original_load = torch.load

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

    def save_call(original):
        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):  # a buffer in memory is nobody's file
                rec.event("save", path=os.fspath(f), site=rec.site(), devices=sorted(devices_in(obj, set())))
            return original(obj, f, *args, **kwargs)
        return save

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

    def load_call(original):
        def load(f, map_location=None, *args, weights_only=None, **kwargs):
            if rec.called_from_torch():  # torch's own (all_gather_object unpickles the ranks' objects so)
                return original(f, map_location, *args, weights_only=weights_only, **kwargs)
            where = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<a file object>"
            rec.event("load", path=where, site=rec.site(), map_location=map_location_text(map_location),
                      weights_only=weights_only,
                      saved_from=saved_locations(f) if map_location is None or isinstance(map_location, dict)
                      else None)
            return original(f, map_location, *args, weights_only=weights_only, **kwargs)
        return load

    _replace(torch, "save", save_call)
    _replace(torch, "load", load_call)


# --- arguments: --compare gives one process N times a per-rank batch flag --------------------------------------------

def _install_arguments(rec):
    """Under --compare: the script's integer options, as parsed (a per-rank batch flag's name and value)."""
    import argparse

    if not os.environ.get("LESSONS_DOCTOR_COMPARE"):
        return

    def parse_call(original):
        def parse_known_args(self, *args, **kwargs):
            parsed = original(self, *args, **kwargs)
            namespace = parsed[0] if isinstance(parsed, tuple) else parsed
            options = []
            for action in self._actions:
                value = getattr(namespace, action.dest, None)
                flags = [f for f in action.option_strings if f.startswith("--")]
                if flags and isinstance(value, int) and not isinstance(value, bool):
                    options.append([max(flags, key=len), value])
            if options:
                rec.event("arguments", site=rec.site(), options=options)
            return parsed
        return parse_known_args

    _replace(argparse.ArgumentParser, "parse_known_args", parse_call)


# --- the end: the parameters to compare, and whether the group was left --------------------------------------------

def _install_exit(rec):
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


def _install(out_dir, rank):
    import torch
    # Not an instrument: the course's teardown fix (ddp_scripts/ddp_common.py, appendix section 5), so that a
    # script's rare abort at exit (a gloo thread meeting Python's shutdown) never fails the doctor's launch. Imported
    # here, before the script's init_process_group; the garbage is collected at exit.
    import torch.distributed.nn  # noqa: F401

    rec = _Recorder(out_dir, rank)
    rec.event("start", rank=rank, pid=os.getpid(), torch=torch.__version__)
    for install in (_install_data, _install_optimizers, _install_wrappers, _install_process_group, _install_files,
                    _install_arguments, _install_exit):
        install(rec)


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
