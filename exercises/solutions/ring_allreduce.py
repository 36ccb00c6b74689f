"""A solution of exercises/ring_allreduce.py: a ring all-reduce from point-to-point operations.

Reduce-scatter (N-1 steps: each rank ends with the full sum of one chunk), then all-gather (N-1 steps: each
rank passes the finished chunks on). Each step sends one chunk to the next rank and receives one from the
previous; batch_isend_irecv posts both at once, so no pair of ranks waits on each other.
"""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return
    # tensor_split gives exactly `world` chunks for any length: sizes differ by at most one, some may be empty.
    chunks = list(tensor.view(-1).tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(2 * (world - 1)):
        reducing = step < world - 1
        k = step if reducing else step - (world - 1)
        send_index = (rank - k + (0 if reducing else 1)) % world
        recv_index = (rank - k - 1 + (0 if reducing else 1)) % world
        received = torch.empty_like(chunks[recv_index])
        ops = [dist.P2POp(dist.isend, chunks[send_index].contiguous(), right),
               dist.P2POp(dist.irecv, received, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        if reducing:
            chunks[recv_index] += received  # the chunks are views: the sum lands in `tensor` itself
        else:
            chunks[recv_index].copy_(received)
