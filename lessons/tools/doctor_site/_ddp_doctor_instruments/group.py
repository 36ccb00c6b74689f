"""The instruments of the process group and the model: optimizers (their steps, the parameters to compare),
wrappers (DDP, FSDP), the group (the rank it was given, the script's own collectives), and ranks the script starts
itself (mp.spawn, multiprocessing's Process)."""
import os
import sys

from .recorder import _replace, shown_path


def install_optimizers(rec):
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

    def local(p):
        """A parameter as this rank holds it: a DTensor's local shard (FSDP2's fully_shard, tensor parallelism),
        which may be empty (a 1-element parameter on 2 ranks). Arithmetic on the DTensor itself would be a
        collective the script never made, and .item() on it one more: the run would change because it was watched."""
        return p.to_local() if hasattr(p, "to_local") and type(p).__name__ == "DTensor" else p

    def parameters(optimizer):
        return [local(p).detach().float().cpu().clone() for g in optimizer.param_groups for p in g["params"]]

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
            before[id(optimizer)] = [local(p).detach().clone() for g in optimizer.param_groups for p in g["params"]]

    def after_step(optimizer, args, kwargs):
        rec.steps += 1
        if comparing and optimizer in rec.optimizers and id(optimizer) not in rec.after_first:
            rec.after_first[id(optimizer)] = parameters(optimizer)
        if optimizer in rec.optimizers and id(optimizer) not in rec.first_sums:
            # Two numbers a tensor, once: replicas agree after their first step; separate models part there.
            with torch.no_grad():
                rec.first_sums[id(optimizer)] = [
                    [local(p).detach().double().sum().item(), local(p).detach().double().abs().sum().item()]
                    for g in optimizer.param_groups for p in g["params"]]
        if comparing and id(optimizer) in before:
            now = [local(p).detach() for g in optimizer.param_groups for p in g["params"]]
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
            # FSDP2's fully_shard: rows split over a 1-D mesh (Shard(0)); put together again from the ranks' shards
            # in the mesh's order. Any other layout is the rank's own, and nothing to compare.
            placements = getattr(p, "placements", ())
            one_dim = getattr(p, "device_mesh", None) is not None and p.device_mesh.ndim == 1
            return "dshard" if one_dim and [str(x) for x in placements] == ["S(0)"] else None
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
                if kind == "dshard":  # this rank's rows, named by their place on the mesh
                    params[f"dshard{p.device_mesh.get_coordinate()[0]}.opt{i}.{j}"] = local(p).detach().float().cpu()
                else:
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

def install_wrappers(rec):
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


# --- the process group: the rank it was given, the script's own collectives, the ranks a script starts ---------------

def install_process_group(rec):
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as torch_mp

    def init_call(original):
        def init_process_group(*args, **kwargs):
            if os.getpid() != rec.pid:  # a process the rank forked (torch.multiprocessing.Process): its own ranks
                _refuse_own_ranks(rec.out_dir, rec.rank, rec.site())
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

    # mp.spawn of several processes under torchrun: every rank would start its own world. Refused when it is called,
    # not when the word
    # is in the file: a script that spawns only under a flag (pytorch/examples' imagenet) runs under torchrun.
    def refuse(call):
        def make(original):
            def spawn(*args, **kwargs):
                nprocs = kwargs.get("nprocs", args[2] if len(args) > 2 else 1)
                if nprocs == 1 and not dist.is_initialized():
                    # One process, started by the rank before any group: the rank's work moves into it (a script
                    # written for both launchers). The instruments follow it: that process records as this rank.
                    os.environ["LESSONS_DOCTOR_FOLLOW"] = str(os.getpid())
                    try:
                        return original(*args, **kwargs)
                    finally:
                        os.environ.pop("LESSONS_DOCTOR_FOLLOW", None)
                rec.event("spawn", site=rec.site(), call=call)
                raise RuntimeError(
                    f"DDP doctor: this script starts its own ranks ({call}) while torchrun has already started"
                    f" {os.environ.get('WORLD_SIZE', '?')}: run it with python (the doctor's torchrun can't), or"
                    " drop the spawn and read RANK, LOCAL_RANK and WORLD_SIZE from the environment")
            return spawn
        return make

    _replace(torch_mp, "spawn", refuse("torch.multiprocessing.spawn"))
    _replace(torch_mp, "start_processes", refuse("start_processes"))


OWN_RANKS = "multiprocessing's Process, each calling init_process_group"


def _refuse_own_ranks(out_dir, rank, site):
    """A process a rank started (multiprocessing's Process, forked or spawned) calls init_process_group: the script
    starts its own ranks under torchrun's. Said in the rank's log (the doctor's one line), and refused here: waiting
    for ranks that never come would hang until the launch's timeout."""
    import json
    with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a") as log:
        log.write(json.dumps({"event": "spawn", "site": site, "call": OWN_RANKS}) + "\n")
    raise RuntimeError(
        f"DDP doctor: this process, started by torchrun's rank {rank}, calls init_process_group: the script starts"
        f" its own ranks while torchrun has already started {os.environ.get('WORLD_SIZE', '?')}: run it with"
        " python (the doctor's torchrun can't), or drop the processes and read RANK, LOCAL_RANK and WORLD_SIZE"
        " from the environment")


class _WhenImported:
    """A sys.meta_path finder that runs THEN(module) once `import NAME` has run NAME's code (in a process a rank
    spawned: nothing of the doctor's is there until the process imports torch.distributed itself). It finds
    nothing itself: it asks the finders after it, and wraps that one import's exec_module."""

    def __init__(self, name, then):
        self.name, self.then, self.seen = name, then, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.seen:
            return None
        self.seen = True
        others = (f for f in list(sys.meta_path) if f is not self and hasattr(f, "find_spec"))
        spec = next((s for s in (f.find_spec(fullname, path, target) for f in others) if s is not None), None)
        loader, then = getattr(spec, "loader", None), self.then
        if loader is None or not hasattr(loader, "exec_module"):
            return spec

        def exec_module(module):
            del loader.exec_module  # the loader's own again
            loader.exec_module(module)
            then(module)
        try:
            loader.exec_module = exec_module
        except AttributeError:  # a loader that takes no attribute: the process is not watched
            pass
        return spec


def watch_a_spawned_process(out_dir, rank):
    """In a process a rank spawned (not forked: a forked one keeps the rank's instruments): its init_process_group
    refused, as the rank's forked ones are. A DataLoader worker never calls it."""
    def refuse_in(distributed):
        import functools
        original = getattr(distributed, "init_process_group", None)
        if original is None:
            return

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            frame, site = sys._getframe(1), "?"
            if frame is not None:
                site = f"{shown_path(os.path.abspath(frame.f_code.co_filename))}:{frame.f_lineno}"
            _refuse_own_ranks(out_dir, rank, site)
        distributed.init_process_group = init_process_group

    sys.meta_path.insert(0, _WhenImported("torch.distributed", refuse_in))
