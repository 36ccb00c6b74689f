"""An exact resume's helpers (lesson 07b): the position in the epoch, every random state, a hash of the parameters."""
import hashlib
import random

import numpy as np
import torch
from torch.utils.data import DistributedSampler


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start an epoch part-way: it skips what this rank already trained on."""
    skip = 0  # samples of the current epoch this rank has seen

    def __iter__(self):
        return iter(list(super().__iter__())[self.skip:])

    def __len__(self):
        return self.num_samples - self.skip


def rng_states() -> dict:
    keys = np.random.get_state()  # ('MT19937', uint32 array, ...): the array stored as a tensor
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": (keys[0], torch.from_numpy(keys[1].astype(np.int64)), *keys[2:])}
    if torch.cuda.is_initialized():  # this rank's GPU has a generator of its own (dropout on the GPU draws from it)
        states["cuda"] = torch.cuda.get_rng_state()  # the current device: cuda:LOCAL_RANK
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
