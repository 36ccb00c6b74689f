"""A typical mistake in exercises/ring_attention.py: causal, the later blocks are skipped but the rank's own block
is attended to whole, so a query sees the keys after it in its own block."""
import torch
import torch.distributed as dist


def attend(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = scores.logsumexp(-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def start_exchange(block, send_to, receive_from):
    received = torch.empty_like(block)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, send_to),
                                    dist.P2POp(dist.irecv, received, receive_from)])
    return received, works


def merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


def ring_attention(q, k, v, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    out, lse = None, None
    kv = torch.stack([k, v])
    for step in range(world):
        if step < world - 1:
            received, works = start_exchange(kv, send_to=(rank + 1) % world, receive_from=(rank - 1) % world)
        source = (rank - step) % world  # the block came from rank - 1, which had it from rank - 2, ...
        if not (causal and source > rank):  # a later block: every key after every query of this rank
            n = q.shape[1]
            mask = None  # the mistake: the rank's own block seen whole
            block_out, block_lse = attend(q, kv[0], kv[1], mask)
            out, lse = (block_out, block_lse) if out is None else merge(out, lse, block_out, block_lse)
        if step < world - 1:
            for work in works:
                work.wait()
            kv = received
    return out
