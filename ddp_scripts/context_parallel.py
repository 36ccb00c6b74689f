"""Context parallelism: one attention layer over a sequence split across ranks, checked against one process.

    torchrun --standalone --nproc-per-node=2 context_parallel.py --mode ring --seq-len 64 --heads 4 [--causal]
                                                                 [--zigzag] [--cases ring+causal,ulysses+causal]

ring: the K/V blocks travel around the ring (isend/irecv), merged by their log-sum-exp. ulysses: an all-to-all
trades sequence shards for head shards, and back. Checked against one process: the attention's output, dQ/dK/dV and
one SGD step of a small model. A length that does not divide is padded: keys masked, queries dropped.
"""
import argparse
import copy
import json
import os

import torch
import torch.distributed as dist

import ddp_common  # a clean exit, and the device

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("ring", "ulysses"), default="ring")
parser.add_argument("--seq-len", type=int, default=64, help="L, the tokens of the whole sequence")
parser.add_argument("--heads", type=int, default=4, help="H; ulysses: a multiple of the ranks")
parser.add_argument("--head-dim", type=int, default=8)
parser.add_argument("--causal", action="store_true", help="a token sees itself and those before")
parser.add_argument("--zigzag", action="store_true", help="ring: rank r holds chunks r and 2N-1-r of 2N")
parser.add_argument("--cases", default="", help="several, e.g. ring+causal,ulysses")
parser.add_argument("--seed", type=int, default=0)
options = parser.parse_args()
L, H, D, N = options.seq_len, options.heads, options.head_dim, int(os.environ["WORLD_SIZE"])
cases = options.cases.split(",") if options.cases else [
    "+".join([options.mode] + ["causal"] * options.causal + ["zigzag"] * options.zigzag)]
for name in cases:
    mode, *flags = name.split("+")
    if mode not in ("ring", "ulysses") or not set(flags) <= {"causal", "zigzag"}:
        parser.error(f"a case is ring or ulysses, then +causal and/or +zigzag: got {name}")
    if mode == "ulysses" and H % N:
        parser.error(f"ulysses gives each of the {N} ranks H/N whole heads: --heads {H} is not a multiple of {N}")
    if mode == "ulysses" and "zigzag" in flags:
        parser.error("--zigzag evens the ring's causal work; ulysses needs none")
    if L < N * (2 if "zigzag" in flags else 1):
        parser.error(f"--seq-len {L} is shorter than the chunks ({N} ranks, 2 a rank with --zigzag)")

backend, device = ddp_common.backend_and_device()  # a GPU for each rank, else gloo on the CPU
dist.init_process_group(backend)
rank = dist.get_rank()
SCALE = D ** -0.5


def sharding(zigzag):
    """Chunk size and the chunks each rank holds: chunk r, or with zigzag chunks r and 2N-1-r (head and tail)."""
    chunks = 2 * N if zigzag else N
    size = -(-L // chunks)  # the last chunk takes the padding: chunks * size - L tokens
    return size, [[r, chunks - 1 - r] if zigzag else [r] for r in range(N)]


def block_pairs(step, size, owned, causal):
    """This rank's work at ring step `step`: (query slice, key slice, mask), a pair of chunks each."""
    source = (rank - step) % N  # blocks travel to rank + 1: at step s this rank holds rank (r - s)'s K/V
    for i, query_chunk in enumerate(owned[rank]):
        for j, key_chunk in enumerate(owned[source]):
            if key_chunk * size >= L or (causal and key_chunk > query_chunk):
                continue  # all padding, or all in the future
            keys = key_chunk * size + torch.arange(size, device=device)
            mask = (keys < L).expand(size, size)  # padded keys masked
            if causal and key_chunk == query_chunk:  # the diagonal block: masked inside
                mask = mask & (keys[None, :] <= (query_chunk * size + torch.arange(size, device=device))[:, None])
            yield slice(i * size, (i + 1) * size), slice(j * size, (j + 1) * size), mask


def start_ring_pass(block, tag):
    """Send the block to the next rank, receive the previous rank's: started now, waited on later."""
    received = torch.empty_like(block)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, (rank + 1) % N, tag=tag),
                                    dist.P2POp(dist.irecv, received, (rank - 1) % N, tag=tag)])
    return received, works


def scores(q, k, mask):
    return (q @ k.transpose(-2, -1) * SCALE).masked_fill(~mask, float("-inf"))


class RingAttention(torch.autograd.Function):
    """Forward: the online softmax over the blocks as they come. Backward: the same ring again; each block's
    gradient travels with it (tag 1) and is home after the last step."""

    @staticmethod
    def forward(ctx, q, k, v, sizes, causal, work):
        out, lse = torch.zeros_like(q), torch.full_like(q[..., :1], float("-inf"))
        kv = torch.stack([k, v])  # one message a step
        for step in range(N):
            if step < N - 1:
                received, works = start_ring_pass(kv, tag=0)  # in flight while this block is computed
            for qs, ks, mask in block_pairs(step, *sizes, causal):
                s = scores(q[:, qs], kv[0][:, ks], mask)
                block_lse = s.logsumexp(-1, keepdim=True)
                block_out = torch.exp(s - block_lse) @ kv[1][:, ks]  # a softmax over this block's keys only
                new_lse = torch.logaddexp(lse[:, qs], block_lse)
                out[:, qs] = torch.exp(lse[:, qs] - new_lse) * out[:, qs] + torch.exp(block_lse - new_lse) * block_out
                lse[:, qs] = new_lse
                work.append(s.numel())
            if step < N - 1:
                for w in works:
                    w.wait()
                kv = received
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.sizes, ctx.causal = sizes, causal
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        row_dot = (d_out * out).sum(-1, keepdim=True)  # softmax's backward needs sum_j p_ij dp_ij = dO . O
        dq, kv = torch.zeros_like(q), torch.stack([k, v])
        dkv = torch.zeros_like(kv)
        for step in range(N):
            if step < N - 1:
                received, works = start_ring_pass(kv, tag=0)
            for qs, ks, mask in block_pairs(step, *ctx.sizes, ctx.causal):
                p = torch.exp(scores(q[:, qs], kv[0][:, ks], mask) - lse[:, qs])  # this block's share of the softmax
                dkv[1][:, ks] += p.transpose(-2, -1) @ d_out[:, qs]
                ds = p * (d_out[:, qs] @ kv[1][:, ks].transpose(-2, -1) - row_dot[:, qs])
                dq[:, qs] += ds @ kv[0][:, ks] * SCALE
                dkv[0][:, ks] += ds.transpose(-2, -1) @ q[:, qs] * SCALE
            if N > 1:  # the block's gradient goes on with it: after step N-1 it reaches the block's own rank
                dkv, dkv_works = start_ring_pass(dkv, tag=1)
                for w in dkv_works:
                    w.wait()
            if step < N - 1:
                for w in works:
                    w.wait()
                kv = received
        return dq, dkv[0], dkv[1], None, None, None


class AllToAll(torch.autograd.Function):
    """all_to_all_single with a backward (torch's all_to_all_single_autograd imports the compiler: 1.3 s a rank)."""

    @staticmethod
    def forward(ctx, t):
        t = t.contiguous()
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)  # piece j of dim 0 to rank j; piece j back from rank j
        return out

    @staticmethod
    def backward(ctx, grad):  # each piece's gradient goes back where it came from
        return AllToAll.apply(grad)


def ulysses_attention(q, k, v, causal, padded):
    """(H, n, D): this rank's tokens, every head -> all-to-all -> (H/N, N*n, D): every token, this rank's heads."""
    n = q.shape[1]

    def to_head_shard(t):  # dim 0: the rank it goes to, then came from
        got = AllToAll.apply(t.reshape(N, H // N, n, D))
        return got.reshape(N, H // N, n, D).transpose(0, 1).reshape(H // N, N * n, D)

    # Causal, no query sees the padding (at the end); else a row of key padding, broadcast: no L x L mask.
    keys_mask = None if causal or padded == L else (torch.arange(padded, device=device) < L)[None]
    out = torch.nn.functional.scaled_dot_product_attention(*map(to_head_shard, (q, k, v)), attn_mask=keys_mask,
                                                           is_causal=causal)
    back = out.reshape(H // N, N, n, D).transpose(0, 1).contiguous()
    return AllToAll.apply(back).reshape(H, n, D)


class AttentionModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(H * D, 3 * H * D), torch.nn.Linear(H * D, H * D)

    def forward(self, x, attention):
        q, k, v = (t.reshape(-1, H, D).transpose(0, 1) for t in self.qkv(x).chunk(3, dim=-1))  # (H, tokens, D)
        for t in (q, k, v):
            t.retain_grad()
        out = attention(q, k, v)
        return (q, k, v, out), self.proj(out.transpose(0, 1).reshape(-1, H * D))


def saved_for_backward(model, forward):
    """forward()'s result, and the bytes autograd saved meanwhile: each storage once, not the weights."""
    weights, kept = {p.untyped_storage().data_ptr() for p in model.parameters()}, {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = forward()
    return result, sum(kept.values())


def relative_diff(mine, ref):  # float32 summed in another order: about 1e-7
    return ((mine - ref).abs().max() / ref.abs().max()).item()


@torch.no_grad()
def sgd_step(model, lr=0.1):  # torch.optim.SGD imports the compiler: 1.3 s a rank
    for p in model.parameters():
        p -= lr * p.grad


torch.manual_seed(options.seed)  # the same model and data on every rank, and in the reference
reference = AttentionModel().to(device)
x, target = torch.randn(L, H * D, device=device), torch.randn(L, H * D, device=device)
results = {}
for name in cases:
    mode, causal, zigzag = name.split("+")[0], "causal" in name, "zigzag" in name
    # One process, the whole sequence: the reference.
    whole = copy.deepcopy(reference)
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    (ref_qkvo, y), whole_bytes = saved_for_backward(whole, lambda: whole(x, sdpa))
    ((y - target) ** 2).sum().div(L).backward()
    sgd_step(whole)
    # This rank: its chunks of the padded sequence.
    size, owned = sharding(zigzag)
    padded = size * len(owned[0]) * N
    positions = torch.cat([c * size + torch.arange(size, device=device) for c in owned[rank]])
    real = positions < L
    x_here = torch.nn.functional.pad(x, (0, 0, 0, padded - L))[positions]
    model, work = copy.deepcopy(reference), []
    if mode == "ring":
        attention = lambda q, k, v: RingAttention.apply(q, k, v, (size, owned), causal, work)  # noqa: E731
    else:
        attention = lambda q, k, v: ulysses_attention(q, k, v, causal, padded)  # noqa: E731
    (qkvo, y_here), rank_bytes = saved_for_backward(model, lambda: model(x_here, attention))
    loss = ((y_here[real] - target[positions[real]]) ** 2).sum().div(L)  # padded queries dropped
    loss.backward()  # the ranks' losses add up to the whole sequence's
    for p in model.parameters():
        dist.all_reduce(p.grad)  # summed: the whole sequence's gradient
    sgd_step(model)
    out_diff = relative_diff(qkvo[3][:, real], ref_qkvo[3][:, positions[real]])
    grad_diff = {t: relative_diff(mine.grad[:, real], ref.grad[:, positions[real]])
                 for t, mine, ref in zip("qkv", qkvo, ref_qkvo)}
    step_diff = max(relative_diff(p, q) for p, q in zip(model.parameters(), whole.parameters()))
    every = [None] * N
    dist.all_gather_object(every, {"out": out_diff, **grad_diff, "step": step_diff, "pairs": len(work),
                                   "elements": sum(work), "largest": max(work, default=0), "bytes": rank_bytes})
    worst = {key: max(r[key] for r in every) for key in ("out", "q", "k", "v", "step")}  # step: the weights after
    results[name] = {
        "mode": mode, "causal": causal, "zigzag": zigzag,
        "matches_single_process": max(worst.values()) < 1e-5,  # max |diff| / max |value|, over every rank
        "max_rel_diff": worst, "padded": padded - L,
        "saved_bytes_per_rank": [r["bytes"] for r in every], "single_process_saved_bytes": whole_bytes,
        # ring only (ulysses calls scaled_dot_product_attention): the QK^T blocks it built
        "block_pairs_per_rank": [r["pairs"] for r in every] if mode == "ring" else None,
        "score_elements_per_rank": [r["elements"] for r in every] if mode == "ring" else None,
        "largest_score_block": max(r["largest"] for r in every) if mode == "ring" else None}
    if rank == 0:
        print(f"{name}, L={L} on {N} ranks: output, dQ/dK/dV and the SGD step match one process: "
              f"{results[name]['matches_single_process']}")
if rank == 0:
    print("RESULT " + json.dumps({"world_size": N, "seq_len": L, "heads": H, "case": cases[0], **results[cases[0]],
                                  "cases": results}))
dist.destroy_process_group()
