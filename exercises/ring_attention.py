"""Exercise (lesson 15c): ring attention's forward, one block of keys at a time.

Each rank holds one block of the sequence: rank r holds tokens r*n .. (r+1)*n - 1, as its queries q and its keys and
values k, v, each (heads, n, head_dim). Define

* merge(out_a, lse_a, out_b, lse_b) -> (out, lse): the attentions of the same queries over two disjoint sets of keys,
  each with its log-sum-exp of the scores (heads, n, 1), merged into the attention over both sets, with its lse;
* ring_attention(q, k, v, causal) -> out: this rank's queries against the whole sequence. The K/V blocks travel around
  the ring (start_exchange, given, sends the block you hold to the next rank and receives the previous rank's); at
  each step attend to the block you hold (attend, given) and merge the result into what you have. Causal: a query
  sees the keys at or before its own position: skip the blocks after your own, and mask inside your own.

The check runs merge() on blocks of its own, then ring_attention() at 2, 3 and 4 ranks, causal and not, 3 and 5
tokens a rank, against scaled_dot_product_attention over the whole sequence in one process. It names the mistake: a
merge without the rescaling, the diagonal block unmasked, a block taken for another rank's.

Check it:   python -m lessons check ring_attention
"""
import torch
import torch.distributed as dist


def attend(q, k, v, mask=None):
    """Attention of the queries q over the keys k (values v) alone: (out, lse). mask: True where a query sees a key."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = scores.logsumexp(-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def start_exchange(block, send_to, receive_from):
    """Send `block` to rank send_to and receive a block of its shape from rank receive_from, without waiting:
    (received, works). Wait on every work before you read `received`; meanwhile, compute."""
    received = torch.empty_like(block)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, send_to),
                                    dist.P2POp(dist.irecv, received, receive_from)])
    return received, works


def merge(out_a, lse_a, out_b, lse_b):
    # TODO: out_a is a softmax over its own keys only, weighted as if they were all the keys there are. What share
    #       of the softmax over both sets do its keys get? (lse is the log of the softmax's denominator.)
    raise NotImplementedError("return (out, lse): the attention over both sets of keys, and its log-sum-exp")


def ring_attention(q, k, v, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    out, lse = None, None
    kv = torch.stack([k, v])  # one message a step
    for step in range(world):
        if step < world - 1:  # the next block is on its way while this one is computed
            received, works = start_exchange(kv, send_to=(rank + 1) % world, receive_from=(rank - 1) % world)
        # TODO: whose block is kv at this step? Causal: skip it if it comes after yours; mask it if it is yours.
        #       Then attend to it and merge (the first block has nothing to merge with).
        if step < world - 1:
            for work in works:
                work.wait()
            kv = received
    return out
