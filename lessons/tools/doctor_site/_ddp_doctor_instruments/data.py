"""The instruments of data: data sets, samplers, loaders, passes (the indices each drew), and under --compare the
script's integer options (a per-rank batch flag) and the one process's batches."""
import os
import sys

from .recorder import INDICES_PER_PASS, RECORDED_PASSES, _replace


def install_data(rec):
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

    def beneath_subsets(dataset, read_samples):
        """(the fingerprint of the data set beneath the loader's Subsets, each index of the loader's data set as an
        index into that one): ranks that each evaluate a Subset of one set draw shares of it. (None, None) past
        INDICES_PER_PASS indices; the loader's own set and None when it is not a Subset."""
        mapping = None
        while isinstance(dataset, torch.utils.data.Subset):
            if len(dataset.indices) > INDICES_PER_PASS:
                return None, None
            inner = [int(i) for i in dataset.indices]
            mapping = inner if mapping is None else [inner[i] for i in mapping]
            dataset = dataset.dataset
        return fingerprint(dataset, read_samples=read_samples), mapping

    def drawn_from(loader):
        """The sampler the loader really draws its indices from: a batch_sampler's own (a custom distributed
        sampler inside it), not the placeholder SequentialSampler the DataLoader keeps beside it."""
        inner = getattr(loader.batch_sampler, "sampler", None)  # given a batch_sampler, a loader has no batch_size
        return inner if loader.batch_size is None and isinstance(inner, torch.utils.data.Sampler) else loader.sampler

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
        """The one process's batch_sampler: each pass, the union of the ranks' batches of that pass. The pass is the
        loader's, as the instruments count them, not a count of calls to iter(): with workers, torch calls
        iter(batch_sampler) twice as a pass starts."""

        def __init__(self, passes, replaced):
            self.passes, self.replaced, self.loader = passes, replaced, None

        def number(self):
            """The loader's pass (counted as it starts, before the iterator calls iter() on this)."""
            return min(max(getattr(self.__dict__["loader"], "_doctor_passes", 0), 1), len(self.passes))

        def __iter__(self):
            return iter(self.passes[self.number() - 1])

        def __len__(self):
            return len(self.passes[self.number() - 1])

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
            if isinstance(self.batch_sampler, RanksBatches):
                self.batch_sampler.loader = self
            sampler = drawn_from(self) if isinstance(drawn_from(self), DistributedSampler) else None
            try:
                length = len(dataset)
            except Exception:  # noqa: BLE001
                length = None
            read_samples = self.num_workers == 0
            base, base_indices = beneath_subsets(dataset, read_samples)
            rec.event("loader", loader=self._doctor_id, site=where, batch_size=self.batch_size,
                      asked_batch_size=asked, sampler=getattr(sampler, "_doctor_id", None),
                      sampler_type=type(drawn_from(self)).__name__,
                      batch_sampler=type(self.batch_sampler).__name__ if self.batch_sampler is not None else None,
                      dataset=fingerprint(dataset, read_samples=read_samples), length=length,
                      drop_last=bool(self.drop_last), base_dataset=base, base_indices=base_indices)
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
        sampler = drawn_from(loader) if isinstance(drawn_from(loader), DistributedSampler) else None
        iterator._doctor = {"loader": loader_id, "pass": loader._doctor_passes, "batches": 0, "indices": [],
                            "sizes": [], "record": loader._doctor_passes <= RECORDED_PASSES}
        rec.open_passes[loader_id] = iterator._doctor
        rec.new_pass = True
        rec.event("pass", loader=loader_id, number=loader._doctor_passes, site=rec.site(), steps=rec.steps,
                  sampler=getattr(sampler, "_doctor_id", None), epoch=int(sampler.epoch) if sampler else None,
                  joined=rec.joined > 0)

    # A pass starts before the iterator's own start: with workers, it takes the first batches' indices from the
    # sampler there (the prefetch), and those are the pass's first draws.
    def iter_init(original):
        def __init__(self, loader, *args, **kwargs):
            start_pass(self, loader)
            original(self, loader, *args, **kwargs)
        return __init__

    def iter_reset(original):
        """persistent_workers=True: one iterator for the loader's life, reset for each pass after the first."""
        def _reset(self, loader, first_iter=False):
            if not first_iter:
                doctor = getattr(self, "_doctor", None)
                if doctor is not None and not doctor.get("ended"):  # the last pass was left before its end
                    doctor["ended"] = True
                    pass_end(doctor, complete=False)
                start_pass(self, loader)
            original(self, loader, first_iter)
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


# --- arguments: --compare gives one process N times a per-rank batch flag --------------------------------------------

def install_arguments(rec):
    """Under --compare: the script's integer options, as parsed (a per-rank batch flag's name and value)."""
    import argparse

    if not os.environ.get("LESSONS_DOCTOR_COMPARE"):
        return

    def parse_call(original):
        def parse_known_args(self, *args, **kwargs):
            parsed = original(self, *args, **kwargs)
            namespace = parsed[0] if isinstance(parsed, tuple) else parsed
            options, numbers = [], []
            for action in self._actions:
                value = getattr(namespace, action.dest, None)
                flags = [f for f in action.option_strings if f.startswith("--")]
                if flags and isinstance(value, int) and not isinstance(value, bool):
                    options.append([max(flags, key=len), value])
                elif flags and isinstance(value, float):
                    numbers.append([max(flags, key=len), value])
            if options or numbers:
                rec.event("arguments", site=rec.site(), options=options, numbers=numbers)
            return parsed
        return parse_known_args

    _replace(argparse.ArgumentParser, "parse_known_args", parse_call)
