"""What a resumable DDP run needs, in one place: save once and atomically, load safely, resume exactly.

Imported by train_resumable.py and checkpoint_prefixes.py (lesson 07). Nothing here is specific to a model.
"""
import hashlib
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.utils.data import DistributedSampler


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message is one line that names the file."""


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start an epoch part-way: it skips what this rank already trained on."""
    skip = 0  # samples of the current epoch this rank has seen

    def __iter__(self):
        return iter(list(super().__iter__())[self.skip:])

    def __len__(self):
        return self.num_samples - self.skip


def save_atomically(state: dict, path: Path) -> None:
    """Temporary file in the same directory, on disk, then renamed over `path` (a rename is atomic):
    whenever the process dies, `path` is the old checkpoint or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)


def load_checkpoint(path) -> dict:
    """torch.load that never runs code from the file, and fails in one line that names it."""
    try:  # map_location="cpu": every rank reads onto the CPU, not onto the GPU the file was saved from
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{path}: cannot load it ({type(e).__name__}: {first_line})") from None


def load_model_state(model: torch.nn.Module, state: dict, path) -> None:
    """load_state_dict for a plain model, from a plain or a DDP checkpoint; a mismatch is one line."""
    state = dict(state)
    consume_prefix_in_state_dict_if_present(state, "module.")  # saved from the DDP wrapper: drop its prefix
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong_shape = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    differences = [f"{what} {keys[:3]}{' ...' if len(keys) > 3 else ''}" for what, keys in
                   (("missing", missing), ("unexpected", unexpected), ("other shape", wrong_shape)) if keys]
    if differences:
        raise CheckpointError(f"{path} is not a checkpoint of this model: {'; '.join(differences)}")
    model.load_state_dict(state)


def newest_checkpoint(directory: Path):
    """(path, checkpoint) of the newest file that loads; a half-written or corrupt one is skipped."""
    for path in sorted(directory.glob("step_*.pt"), reverse=True):  # step_000072.pt: names sort by step
        try:
            return path, load_checkpoint(path)
        except CheckpointError as e:
            print(f"skipping {e}", file=sys.stderr)
    return None, None


def rng_states() -> dict:
    keys = np.random.get_state()  # ('MT19937', uint32 array, pos, has_gauss, cached): stored as a tensor
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": (keys[0], torch.from_numpy(keys[1].astype(np.int64)), *keys[2:])}
    if torch.cuda.is_initialized():  # this rank's GPU has a generator of its own (dropout on the GPU draws from it)
        states["cuda"] = torch.cuda.get_rng_state()  # the current device: cuda:LOCAL_RANK (get_rng_state_all: all)
    return states


def set_rng_states(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_initialized():  # a GPU run's checkpoint, resumed on a GPU
        torch.cuda.set_rng_state(state["cuda"])


def params_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for _, p in model.named_parameters():  # a fixed order
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
