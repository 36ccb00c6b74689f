"""Exercise (lesson 02): write a ring all-reduce from point-to-point operations.

Define ring_all_reduce(tensor) -> None: it sums `tensor` over every rank of the default process group, in
place, like dist.all_reduce(tensor), using only point-to-point operations (dist.send/recv, isend/irecv, or
batch_isend_irecv with dist.P2POp). No collective (all_reduce, all_gather, broadcast, barrier, ...).

Each rank may send at most 2(N-1)/N of the tensor's bytes (plus one element per chunk): split the tensor into N
chunks, reduce-scatter them around the ring (N-1 steps), then all-gather them (N-1 steps).

Check it:   python -m lessons check ring_allreduce
(at 2, 3 and 5 ranks, lengths 1, N-1, N+1 and odd, float32 and float64, against dist.all_reduce.)
"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO 1: split the tensor into `world` chunks that are views of it (any length: even 1 with 5 ranks).
    # TODO 2: reduce-scatter: world-1 steps; at each, send one chunk to rank (rank+1) % world, receive one from
    #         (rank-1) % world and add it to your chunk of the same index.
    # TODO 3: all-gather: world-1 more steps; pass the finished chunks on, copying each one you receive.
    # Hint: post each step's send and receive together (batch_isend_irecv), or every rank sends first and waits.
    pass
