"""Context parallelism: one attention layer over a sequence split across ranks, checked against one process.

    torchrun --standalone --nproc-per-node=2 context_parallel.py --mode ring --seq-len 64 --heads 4 [--causal]
                                                                 [--zigzag] [--cases ring+causal,ulysses+causal]

ring: each rank keeps its queries; the K/V blocks travel around the ring (isend/irecv, started before a block's
attention so that the transfer overlaps it) and the partial results are merged by their log-sum-exp.
ulysses: an all-to-all trades sequence shards for head shards, each rank attends whole sequences, a second trades back.
Checked on a small model (QKV projection, attention, output projection) against the same model in one process: the
attention's output, the gradients of Q, K and V, and the weights after one SGD step. A length that does not divide is
padded: padded keys are masked, padded queries dropped. --cases runs several cases in one launch.
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
parser.add_argument("--heads", type=int, default=4, help="H; ulysses needs a multiple of the world size")
parser.add_argument("--head-dim", type=int, default=8)
parser.add_argument("--causal", action="store_true", help="each token attends to itself and the tokens before it")
parser.add_argument("--zigzag", action="store_true", help="ring: rank r holds chunks r and 2N-1-r of 2N")
parser.add_argument("--cases", default="", help="instead of the three above: e.g. ring+causal+zigzag,ulysses")
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
        parser.error("--zigzag evens ring attention's causal work; ulysses attends whole sequences and needs none")
    if L < N * (2 if "zigzag" in flags else 1):
        parser.error(f"--seq-len {L} is shorter than the chunks ({N} ranks, 2 a rank with --zigzag): give every "
                     "chunk a token")

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
    """What this rank computes at ring step `step`: (query slice, key slice, mask) for each pair of chunks."""
    source = (rank - step) % N  # blocks travel to rank + 1: at step s this rank holds rank (r - s)'s K/V
    for i, query_chunk in enumerate(owned[rank]):
        for j, key_chunk in enumerate(owned[source]):
            if key_chunk * size >= L or (causal and key_chunk > query_chunk):
                continue  # every key is padding, or in every query's future: skipped, no work
            keys = key_chunk * size + torch.arange(size, device=device)
            mask = (keys < L).expand(size, size)  # padded keys masked
            if causal and key_chunk == query_chunk:  # the diagonal block: masked inside
                mask = mask & (keys[None, :] <= (query_chunk * size + torch.arange(size, device=device))[:, None])
            yield slice(i * size, (i + 1) * size), slice(j * size, (j + 1) * size), mask


def start_ring_pass(block, tag):
    """Send the block to the next rank and receive the previous rank's: started now, waited on later."""
    received = torch.empty_like(block)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, (rank + 1) % N, tag=tag),
                                    dist.P2POp(dist.irecv, received, (rank - 1) % N, tag=tag)])
    return received, works


def scores(q, k, mask):
    return (q @ k.transpose(-2, -1) * SCALE).masked_fill(~mask, float("-inf"))


class RingAttention(torch.autograd.Function):
    """Forward: the online softmax over the blocks as they come. Backward: the same ring again; each block's
    gradient travels with it and is home after the last step (a second message, tag 1, beside K/V's tag 0)."""

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
    """dist.all_to_all_single with a backward. torch's all_to_all_single_autograd (distributed._functional_collectives)
    does the same, and imports the compiler on its first call: 1.5 s a rank."""

    @staticmethod
    def forward(ctx, t):
        t = t.contiguous()
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)  # piece j of dim 0 to rank j; piece j back from rank j
        return out

    @staticmethod
    def backward(ctx, grad):  # each gradient piece goes back where its piece came from: the same exchange
        return AllToAll.apply(grad)


def ulysses_attention(q, k, v, causal, padded):
    """(H, n, D): this rank's tokens, every head -> all-to-all -> (H/N, N*n, D): every token, this rank's heads."""
    n = q.shape[1]

    def to_head_shard(t):  # dim 0 of what is sent: the rank it goes to; of what comes back: the rank it came from
        got = AllToAll.apply(t.reshape(N, H // N, n, D))
        return got.reshape(N, H // N, n, D).transpose(0, 1).reshape(H // N, N * n, D)

    keys = torch.arange(padded, device=device)
    mask = (keys < L).expand(padded, padded)
    if causal:
        mask = mask & (keys[None, :] <= keys[:, None])
    out = torch.nn.functional.scaled_dot_product_attention(*map(to_head_shard, (q, k, v)), attn_mask=mask)
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


def relative_diff(mine, ref):  # float32 summed in another order: about 1e-7 of the values' size
    return ((mine - ref).abs().max() / ref.abs().max()).item()


@torch.no_grad()
def sgd_step(model, lr=0.1):  # torch.optim.SGD's, by hand: its first step imports the compiler, 1.5 s a rank
    for p in model.parameters():
        p -= lr * p.grad


torch.manual_seed(options.seed)  # the same model and data on every rank, and in the reference
reference = AttentionModel().to(device)
x, target = torch.randn(L, H * D, device=device), torch.randn(L, H * D, device=device)
results = {}
for name in cases:
    mode, causal, zigzag = name.split("+")[0], "causal" in name, "zigzag" in name
    # One process, the whole sequence: the reference this case is checked against.
    whole = copy.deepcopy(reference)
    ref_qkvo, y = whole(x, lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
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
    qkvo, y_here = model(x_here, attention)
    loss = ((y_here[real] - target[positions[real]]) ** 2).sum().div(L)  # padded queries dropped
    loss.backward()  # the ranks' losses add up to the whole sequence's
    for p in model.parameters():
        dist.all_reduce(p.grad)  # each rank's gradient covers its own tokens' loss: summed, the whole sequence's
    sgd_step(model)
    out_diff = relative_diff(qkvo[3][:, real], ref_qkvo[3][:, positions[real]])
    grad_diff = {t: relative_diff(mine.grad[:, real], ref.grad[:, positions[real]])
                 for t, mine, ref in zip("qkv", qkvo, ref_qkvo)}
    step_diff = max(relative_diff(p, q) for p, q in zip(model.parameters(), whole.parameters()))
    largest = H * size * size if mode == "ring" else H // N * padded * padded  # the scores a rank holds at once
    every = [None] * N
    dist.all_gather_object(every, {"out": out_diff, **grad_diff, "step": step_diff, "pairs": len(work),
                                   "elements": sum(work) if mode == "ring" else H // N * padded * padded})
    worst = {key: max(r[key] for r in every) for key in ("out", "q", "k", "v", "step")}
    results[name] = {
        "mode": mode, "causal": causal, "zigzag": zigzag,
        "matches_single_process": max(worst.values()) < 1e-5,  # max |diff| / max |value|, over every rank
        "max_rel_output_diff": worst["out"], "max_rel_grad_diff": {t: worst[t] for t in "qkv"},
        "max_rel_weight_diff_after_step": worst["step"], "padded": padded - L,
        "block_pairs_per_rank": [r["pairs"] for r in every] if mode == "ring" else None,
        "score_elements_per_rank": [r["elements"] for r in every],  # the work: what QK^T computes
        "largest_score_block_per_rank": largest, "single_process_scores": H * L * L}
    if rank == 0:
        r = results[name]
        print(f"{name}, L={L} on {N} ranks ({r['padded']} padded): output, dQ/dK/dV and the SGD step == one "
              f"process's (max |diff| < 1e-5 of the largest |value|): {r['matches_single_process']}; "
              f"block pairs per rank {r['block_pairs_per_rank']}; largest score block {largest} of one process's "
              f"{H * L * L}")
if rank == 0:
    print("RESULT " + json.dumps({"world_size": N, "seq_len": L, "heads": H, "case": cases[0], **results[cases[0]],
                                  "cases": results}))
dist.destroy_process_group()
