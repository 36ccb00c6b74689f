"""Lesson 07's plumbing: look inside a checkpoint, record a GPU location on a CPU, kill a save halfway.

Each helper is small and says exactly what it does to torch, so a cell can say it too.
"""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

import torch


def describe(value) -> str:
    """One line for one entry of a checkpoint."""
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        if value and all(isinstance(v, torch.Tensor) for v in value.values()):
            names = list(value)
            return f"{len(names)} tensors: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
        return f"dict with keys {sorted(value)}"
    if isinstance(value, list):
        return f"list of {len(value)} ({', '.join(sorted({type(v).__name__ for v in value}))})"
    return repr(value)


def storage_bytes(state) -> int:
    """Bytes of every tensor in a (nested) state."""
    if isinstance(state, torch.Tensor):
        return state.untyped_storage().nbytes()
    if isinstance(state, dict):
        return sum(storage_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(storage_bytes(v) for v in state)
    return 0


# torch.save asks each registered "tagger", in priority order, where a storage lives, and writes that
# string into the file; torch.load hands the string to each registered "deserializer" in turn. Both are
# torch's public extension point, torch.serialization.register_package. Ours answer only inside the
# `with` blocks below; everywhere else they return None and torch's own cpu/cuda entries decide.
_active = {"tag": None, "seen": None}


def _tagger(storage):
    return _active["tag"] if storage.device.type == "cpu" else None


def _deserializer(storage, location):
    if _active["seen"] is None:
        return None
    _active["seen"].append(location)
    return storage  # leave it on the CPU: this machine has nowhere else to put it


torch.serialization.register_package(0, _tagger, _deserializer)  # 0: asked before cpu (10) and cuda (20)


@contextmanager
def saved_as_if_on(location: str):
    """torch.save inside this block records every CPU storage as living on `location` (e.g. "cuda:0"),
    exactly as it would for a tensor saved from that GPU. The bytes are the same."""
    _active["tag"] = location
    try:
        yield
    finally:
        _active["tag"] = None


@contextmanager
def restored_locations():
    """torch.load inside this block reports, in the list it yields, the location torch restores each
    storage to: after map_location has had its say, through torch's own code path."""
    _active["seen"] = seen = []
    try:
        yield seen
    finally:
        _active["seen"] = None


class _DiesHalfway:
    """A file that SIGKILLs its process once half of `size` bytes have been written: a crash mid-save."""

    def __init__(self, path, size):
        self.file, self.left = _open(path, "wb"), size // 2

    def write(self, data):
        data = bytes(data)
        if len(data) >= self.left:
            self.file.write(data[:self.left])
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self.left -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):  # flush, fileno, close, ...
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def kill_during_save(save, state: dict, path: str | Path) -> str:
    """Run `save(state, path)` in a forked child whose file dies halfway through; return how the child ended.

    `save` opens its file with `open`: in the child only, the name `open` that `save` sees (in its
    module's globals) becomes one that returns a file that kills the process once half the
    checkpoint's bytes are written."""
    size = len(_serialized(state))
    pid = os.fork()
    if pid == 0:  # the child: save, and die halfway
        try:
            save.__globals__["open"] = lambda p, mode="r", *a, **k: (
                _DiesHalfway(p, size) if "w" in mode else _open(p, mode, *a, **k))
            save(state, Path(path))
        finally:
            os._exit(1)  # never return into the kernel's code in the child
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"


_open = open


def _serialized(state) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
