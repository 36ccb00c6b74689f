"""Check of exercises/ring_attention.py: merge(out_a, lse_a, out_b, lse_b) and ring_attention(q, k, v, causal).

merge() first, on blocks of the check's own (keys split 3 + 5, then a third block merged into the result): its output
and its lse against attention over all the keys. Then ring_attention() at 2, 3 and 4 ranks, not causal then causal,
with 3 and 5 tokens a rank, against scaled_dot_product_attention over the whole sequence in one process. A wrong
causal output is compared with what the likely mistakes compute: the diagonal block unmasked (its own block seen
whole) is named at any size; a block taken for another rank's shows from 3 ranks on (with 2, the previous rank and
the next are one), and the hint says which way this rank's sends went (isend is counted, as in ring_allreduce's
check). Every output is also checked to come from the ring: at least one block sent point-to-point.
"""
import functools

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from common import all_ranks, call, case, fail, load_learner, passed, start, worlds

HEADS, HEAD_DIM = 2, 4
inside_learner, send_offsets = False, []  # where this rank's isends went while the learner's function ran


def counting(real):
    @functools.wraps(real)
    def isend(tensor, *args, **kwargs):
        if inside_learner:
            dst = kwargs.get("group_dst", kwargs.get("dst", args[0] if args else None))
            send_offsets.append((dst - dist.get_rank()) % dist.get_world_size())
        return real(tensor, *args, **kwargs)
    return isend


# Installed before the learner's file is imported; P2POp and batch_isend_irecv compare op with c10d's isend.
dist.isend = c10d.isend = counting(c10d.isend)


def attention(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def check_merge(merge):
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(HEADS, n, HEAD_DIM, generator=generator) for n in (4, 8, 8))
    parts = [(k[:, :3], v[:, :3]), (k[:, 3:], v[:, 3:])]
    (out_a, lse_a), (out_b, lse_b) = [reference_with_lse(q, *kv) for kv in parts]
    out, lse = call(merge, out_a, lse_a, out_b, lse_b)
    whole = attention(q, k, v)
    if not torch.allclose(out, whole, atol=1e-5):
        how = ("adds the two outputs without rescaling them" if torch.allclose(out, out_a + out_b, atol=1e-5) else
               "averages the two outputs without rescaling them" if torch.allclose(out, (out_a + out_b) / 2, atol=1e-5)
               else "gives an output that differs from attention over both sets of keys")
        fail(f"merge() {how} (max |diff| {(out - whole).abs().max().item():.2g}, keys split 3 + 5). Each output is a "
             "softmax over its own keys; over both, its keys hold exp(lse_i - lse) of the denominator, where lse = "
             "logaddexp(lse_a, lse_b): weigh each output by that")
    third_k, third_v = torch.randn(2, HEADS, 2, HEAD_DIM, generator=generator)
    out_c, lse_c = reference_with_lse(q, third_k, third_v)
    out3, _ = call(merge, out, lse, out_c, lse_c)
    whole3 = attention(q, torch.cat([k, third_k], 1), torch.cat([v, third_v], 1))
    if not torch.allclose(out3, whole3, atol=1e-5):
        fail("merge() merges two blocks right, but a third merged into that result is wrong: the lse it returns must "
             "be the log-sum-exp over both sets of keys, logaddexp(lse_a, lse_b), for the next block's merge")


def reference_with_lse(q, k, v):
    scores = q @ k.transpose(-2, -1) / HEAD_DIM ** 0.5
    return attention(q, k, v), scores.logsumexp(-1, keepdim=True)


def main():
    global inside_learner
    start()
    learner = load_learner("merge", "ring_attention")
    merge_checked = False
    for n in worlds(2, 3, 4):
        rank = dist.get_rank()
        if not merge_checked:
            case("merge() of two blocks, then a third")
            check_merge(learner.merge)
            merge_checked = True
        for causal in (False, True):
            for tokens in (3, 5):
                case(f"{n} ranks, {tokens} tokens a rank, {'causal' if causal else 'not causal'}")
                q, k, v = torch.randn(3, HEADS, n * tokens, HEAD_DIM, generator=torch.Generator().manual_seed(n))
                mine = slice(rank * tokens, (rank + 1) * tokens)
                positions = torch.arange(n * tokens)
                future = positions[None, :] <= positions[:, None]
                expected = attention(q, k, v, future if causal else None)[:, mine]
                send_offsets.clear()
                inside_learner = True
                out = call(learner.ring_attention, q[:, mine].clone(), k[:, mine].clone(), v[:, mine].clone(), causal)
                inside_learner = False
                if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
                    fail(f"ring_attention() returned {type(out).__name__}"
                         f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''} with {n} ranks; it must return "
                         f"this rank's output, shaped like its queries {tuple(expected.shape)}")
                blocks = positions // tokens
                whole_own_block = attention(q, k, v, blocks[None, :] <= blocks[:, None])[:, mine]
                verdicts = all_ranks((not torch.allclose(out, expected, atol=1e-5),
                                      torch.allclose(out, whole_own_block, atol=1e-5), sorted(set(send_offsets))))
                wrong = [r for r, (w, _, _) in enumerate(verdicts) if w]
                if not wrong:
                    if not any(offsets for _, _, offsets in verdicts):
                        fail(f"ring_attention() sent nothing point-to-point with {n} ranks: pass the K/V blocks "
                             "around the ring (start_exchange), one block a step")
                    continue
                first, (_, own_block_whole, offsets) = wrong[0], verdicts[wrong[0]]
                where = f"with {n} ranks, {tokens} tokens a rank, {'causal' if causal else 'not causal'}: rank "
                where += f"{first}'s output differs from one process's"
                if causal and own_block_whole:
                    fail(f"{where}, and equals attention with the diagonal block unmasked: a query sees the later "
                         "keys of its own block. Mask the block that is the rank's own: key position <= query "
                         "position (a lower triangle)")
                if causal and n > 2 and offsets in ([1], [n - 1]):
                    holds = "(r - s)" if offsets == [1] else "(r + s)"
                    fail(f"{where}, though not causal it was right: a block is taken for another rank's. Rank r "
                         f"sends its block to rank r {'+' if offsets == [1] else '-'} 1, so at step s it holds rank "
                         f"{holds} % N's block; the mask and the skip must use that rank's position")
                fail(f"{where}" + (": every block must be attended to once and merged" if not causal else
                                   ": skip the blocks after the rank's own, mask its own, merge the others whole"))
    passed("merge() of two and three blocks; ring_attention() at 2, 3 and 4 ranks, 3 and 5 tokens a rank, causal "
           "and not: every rank's output equals scaled_dot_product_attention over the whole sequence")


if __name__ == "__main__":
    main()
