"""Save atomically, load safely: checkpoint files for any model (lesson 07; imported by train_resumable.py)."""
import os
import sys
from pathlib import Path

import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message is one line that names the file."""


def save_atomically(state: dict, path: Path) -> None:
    """A temporary file in the same directory, on disk, then renamed over `path` (atomic): old or new, never half."""
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
