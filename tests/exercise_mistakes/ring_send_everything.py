"""A typical wrong answer to ring_allreduce: every rank sends its whole tensor to every other rank.
Correct sums, but (N-1) x S bytes per rank instead of a ring's 2(N-1)/N x S: the check's byte count fails it."""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for shift in range(1, world):
        received = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, (rank + shift) % world),
               dist.P2POp(dist.irecv, received, (rank - shift) % world)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        total += received
    tensor.copy_(total)
