"""Ring all-reduce at its smallest: an in-place sum over all ranks with point-to-point sends only.

    torchrun --standalone --nproc-per-node=3 ddp_scripts/ring_minimal.py
"""
import json

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)  # N views into tensor: adding into them changes tensor
    for step in range(2 * (n - 1)):
        send, receive = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        incoming = torch.empty_like(receive)
        # Send right and receive from the left together: a blocking send on every rank would deadlock.
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, incoming, (rank - 1) % n)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        if step < n - 1:
            receive += incoming  # scatter-reduce: add the partial sum
        else:
            receive.copy_(incoming)  # all-gather: take the finished chunk


if __name__ == "__main__":
    backend, device = backend_and_device()
    dist.init_process_group(backend)
    tensor = torch.arange(10, device=device) * (dist.get_rank() + 1)  # integers: the sums are exact
    expected = tensor.clone()
    dist.all_reduce(expected)
    ring_all_reduce(tensor)
    equal = torch.tensor([int(torch.equal(tensor, expected))], device=device)
    dist.all_reduce(equal, op=dist.ReduceOp.MIN)  # every rank must match
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"world_size": dist.get_world_size(), "sum": tensor.tolist(),
                                      "matches_all_reduce": bool(equal.item())}))
    dist.destroy_process_group()
