"""A typical mistake in exercises/ring_attention.py: merge() adds the two outputs as they are. Each is a softmax over
its own keys alone (its weights sum to 1), so the merged weights sum to 2, and a block's keys count as much as the
other's however large their scores: the rescaling by exp(lse_i - lse) is missing."""
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
    return out_a + out_b, lse  # the mistake: each output still a softmax over its own keys alone


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
            mask = torch.ones(n, n, dtype=torch.bool).tril() if causal and source == rank else None
            block_out, block_lse = attend(q, kv[0], kv[1], mask)
            out, lse = (block_out, block_lse) if out is None else merge(out, lse, block_out, block_lse)
        if step < world - 1:
            for work in works:
                work.wait()
            kv = received
    return out
