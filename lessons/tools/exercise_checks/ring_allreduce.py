"""Check of exercises/ring_allreduce.py: ring_all_reduce(tensor) sums in place with point-to-point operations only.

At 2, 3 and 5 ranks; lengths 1, N-1, N+1 and two odd ones; float32 and float64; against dist.all_reduce.
Instruments: every collective of torch.distributed raises while the learner's function runs, and isend (which
send() and batch_isend_irecv() go through) counts the bytes each rank sends. Names are not enough (the functional
collectives, torch.distributed._functional_collectives and torch.ops._c10d_functional, reach the process group
without them), so the Flight Recorder, which records every collective a process group runs (not send/recv), is
read before and after each call: a new entry is a collective, whatever the name it was called by.
"""
import functools
import json
import math
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from common import ExerciseFailure, all_ranks, call, case, fail, load_learner, passed, start, worlds

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")  # before the first process group: the Flight Recorder's length
try:
    from torch._C._distributed_c10d import _dump_fr_trace_json  # torch 2.6 and newer record gloo's collectives
except ImportError:
    _dump_fr_trace_json = None

COLLECTIVES = ["all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
               "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base",
               "_reduce_scatter_base"]
original_all_reduce = dist.all_reduce
inside_learner = False
bytes_sent = 0


def forbidden(name, real):
    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        if inside_learner:
            raise ExerciseFailure(f"ring_all_reduce called dist.{name}, a collective: the ring must use only "
                                  "point-to-point operations (send/recv, isend/irecv, batch_isend_irecv)")
        return real(*args, **kwargs)
    return wrapper


def counting(real):
    @functools.wraps(real)
    def isend(tensor, *args, **kwargs):
        global bytes_sent
        if inside_learner:
            bytes_sent += tensor.numel() * tensor.element_size()
        return real(tensor, *args, **kwargs)
    return isend


def recorded_collectives() -> list[dict]:
    """The Flight Recorder's entries (every process group of this process), oldest first; [] where torch has none."""
    if _dump_fr_trace_json is None:
        return []
    return json.loads(_dump_fr_trace_json(includeCollectives=True)).get("entries", [])


def collectives_since(entries_before: list[dict]) -> list[str]:
    """The collectives recorded since `entries_before` was read, as 'gloo:all_reduce of [[7]]'."""
    last = max((e["record_id"] for e in entries_before), default=-1)
    return [f"{e['profiling_name']} of {e['input_sizes']}" for e in recorded_collectives()
            if e["record_id"] > last and not e.get("is_p2p")]


# Installed before the learner's file is imported, in both places a name can be taken from.
for module in (dist, c10d):
    for name in COLLECTIVES:
        if hasattr(c10d, name):
            setattr(module, name, forbidden(name, getattr(c10d, name)))
counting_isend = counting(c10d.isend)
dist.isend = c10d.isend = counting_isend  # send() calls isend(); P2POp checks op against c10d's isend


def main():
    start()
    learner = load_learner("ring_all_reduce")
    global inside_learner, bytes_sent
    checked = 0
    for n in worlds(2, 3, 5):
        for length in sorted({1, max(n - 1, 1), n + 1, 7 * n + 3, 1001}):
            for dtype in (torch.float32, torch.float64):
                case(f"{n} ranks, length {length}, {str(dtype).removeprefix('torch.')}")
                generator = torch.Generator().manual_seed(1000 * n + length + dist.get_rank())
                tensor = torch.randn(length, generator=generator, dtype=torch.float64).to(dtype)
                expected, original = tensor.clone(), tensor.clone()
                original_all_reduce(expected)
                bytes_sent, inside_learner, recorded = 0, True, recorded_collectives()
                returned = call(learner.ring_all_reduce, tensor)
                inside_learner = False
                sent, ran = bytes_sent, collectives_since(recorded)
                if ran:
                    fail(f"ring_all_reduce ran a collective with {n} ranks ({ran[0]}), though it called none of "
                         "torch.distributed's by name (a functional collective?): the ring must use only "
                         "point-to-point operations (send/recv, isend/irecv, batch_isend_irecv)")
                if returned is not None and returned is not tensor:
                    fail("ring_all_reduce must sum in place and return None; it returned a value: write the sum "
                         "into the tensor it was given")
                if all(all_ranks(torch.equal(tensor, original))):
                    fail(f"the tensor is unchanged with {n} ranks (length {length}): ring_all_reduce must write the "
                         "sum into the tensor it was given")
                error = (tensor - expected).abs().max().item()
                tolerance = (1e-5 if dtype == torch.float32 else 1e-12) * n
                wrong = all_ranks(error > tolerance)
                if any(wrong):
                    ranks = [r for r, w in enumerate(wrong) if w]
                    fail(f"wrong sum with {n} ranks, length {length}, {str(dtype).removeprefix('torch.')}: on rank(s) "
                         f"{ranks} the result differs from dist.all_reduce's (max |diff| {error:.3g} on rank "
                         f"{dist.get_rank()})",
                         "Check the chunk boundaries: lengths not divisible by the world size, and shorter than it.")
                size = length * tensor.element_size()
                bound = 2 * (n - 1) / n * size + 2 * (n - 1) * tensor.element_size()  # + one element per chunk
                if sent > bound:
                    fail(f"rank {dist.get_rank()} sent {sent} bytes for a tensor of {size} bytes with {n} ranks; "
                         "a ring "
                         f"sends at most 2(N-1)/N x {size} + one element per chunk = {math.floor(bound)} bytes. "
                         "Send one chunk to the next rank per step (reduce-scatter, then all-gather), not the "
                         "whole tensor to everyone")
                checked += 1
    passed(f"{checked} cases: 2, 3 and 5 ranks; lengths 1, N-1, N+1 and odd; float32 and float64; "
           "sums equal dist.all_reduce's; bytes sent within the ring's bound")


if __name__ == "__main__":
    main()
