"""Ring all-reduce from scratch, with point-to-point sends, checked against dist.all_reduce.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/ring_allreduce.py --numel 1000 --dtype float32

Split the tensor into N chunks (N = world size). Phase 1, scatter-reduce: N-1 steps; in
each, every rank sends one chunk to its right neighbour and adds the chunk it receives
from its left one. Afterwards rank r holds the complete sum of chunk r+1. Phase 2,
all-gather: N-1 more steps pass the finished chunks on round the ring.
Each rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N * S, less than 2S for any N.
The naive way, reduce everything on rank 0 then send it back (what DataParallel does
on GPU 0), makes rank 0 receive and send (N-1) * S.
"""
import argparse
import json

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


class Traffic:
    """Bytes this rank sent and received, counted at every send and receive."""

    def __init__(self):
        self.sent = self.received = 0


def send_right_receive_left(send: torch.Tensor, receive: torch.Tensor, traffic: Traffic):
    # Post the send and the receive together, as one batch, before waiting on either: if every rank
    # did a blocking send first, every rank would wait for a receive nobody has posted (deadlock).
    # batch_isend_irecv is torch's documented way to do this; on NCCL, separate isend/irecv calls
    # to the same peers can wait on each other in a circle.
    rank, world_size = dist.get_rank(), dist.get_world_size()
    ops = []
    if send.numel():  # chunks are empty when there are fewer elements than ranks
        ops.append(dist.P2POp(dist.isend, send, (rank + 1) % world_size))
        traffic.sent += send.numel() * send.element_size()
    if receive.numel():
        ops.append(dist.P2POp(dist.irecv, receive, (rank - 1) % world_size))
        traffic.received += receive.numel() * receive.element_size()
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()


def ring_all_reduce(tensor: torch.Tensor, traffic: Traffic) -> torch.Tensor:
    """Sum `tensor` over all ranks, in place, with 2(N-1) neighbour exchanges."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)  # sizes differ by at most one element
    incoming = torch.empty_like(chunks[0])  # chunk 0 is the largest
    for step in range(n - 1):  # scatter-reduce
        send, receive = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        send_right_receive_left(send, incoming[: receive.numel()], traffic)
        receive += incoming[: receive.numel()]
    for step in range(n - 1):  # all-gather: finished chunks travel round the ring
        send, receive = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        send_right_receive_left(send, receive, traffic)  # received straight into place
    return tensor


def naive_all_reduce(tensor: torch.Tensor, traffic: Traffic) -> torch.Tensor:
    """Everyone sends everything to rank 0, which sums and sends the result back."""
    rank, n = dist.get_rank(), dist.get_world_size()
    size = tensor.numel() * tensor.element_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for other in range(1, n):
            dist.recv(incoming, src=other)
            tensor += incoming
            traffic.received += size
        for other in range(1, n):
            dist.send(tensor, dst=other)
            traffic.sent += size
    else:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)
        traffic.sent += size
        traffic.received += size
    return tensor


def random_tensor(numel, dtype, seed, device):
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=generator, dtype=dtype).to(device)
    return torch.randint(-1000, 1000, (numel,), generator=generator, dtype=dtype).to(device)


def check(numel, dtype_name, device):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[dtype_name]
    data = random_tensor(numel, dtype, seed=1000 * rank + numel, device=device)
    builtin = data.clone()
    dist.all_reduce(builtin)
    ring_traffic, naive_traffic = Traffic(), Traffic()
    ring = ring_all_reduce(data.clone(), ring_traffic)
    naive = naive_all_reduce(data.clone(), naive_traffic)
    # Floats summed in another order differ in the last bits; integers must be equal.
    tolerance = {"float32": 1e-5, "float64": 1e-12, "int64": 0}[dtype_name]
    max_abs_err = (ring - builtin).abs().max().item() if numel else 0
    matches = torch.allclose(ring, builtin, rtol=tolerance, atol=tolerance)
    naive_matches = torch.allclose(naive, builtin, rtol=tolerance, atol=tolerance)
    # Every rank's byte counts, gathered for rank 0 to report.
    counts = torch.tensor([ring_traffic.sent, ring_traffic.received, naive_traffic.sent,
                           naive_traffic.received, int(matches), int(naive_matches)], device=device)
    everyone = [torch.empty_like(counts) for _ in range(world_size)]
    dist.all_gather(everyone, counts)
    everyone = torch.stack(everyone).cpu().tolist()
    return {"numel": numel, "dtype": dtype_name, "max_abs_err": max_abs_err,
            "matches_builtin": all(row[4] for row in everyone),
            "naive_matches_builtin": all(row[5] for row in everyone),
            "bytes_per_rank": {"ring": {"sent": [r[0] for r in everyone], "received": [r[1] for r in everyone]},
                               "naive": {"sent": [r[2] for r in everyone], "received": [r[3] for r in everyone]}}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=int, nargs="+", default=[1000])
    parser.add_argument("--dtype", choices=DTYPES, nargs="+", default=["float32"])
    args = parser.parse_args()
    if min(args.numel) < 0:
        parser.error("--numel must be >= 0")

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    checks = [check(numel, dtype, device) for numel in args.numel for dtype in args.dtype]
    if dist.get_rank() == 0:
        for c in checks:
            print(f"{dist.get_world_size()} ranks, {c['numel']:>8} x {c['dtype']:<7}: ring == dist.all_reduce: "
                  f"{c['matches_builtin']} (max |diff| {c['max_abs_err']:.1e})")
        result = {"world_size": dist.get_world_size(), "matches_builtin": all(c["matches_builtin"] for c in checks)}
        if len(checks) == 1:
            result.update(checks[0])
        else:
            result["checks"] = checks
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
