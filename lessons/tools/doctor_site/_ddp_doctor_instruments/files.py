"""The instruments of files: who saves, and where a load puts the tensors (the devices the file was saved from)."""
import os

from .recorder import _replace


def install_files(rec):
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
