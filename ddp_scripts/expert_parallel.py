"""Expert parallelism: a mixture-of-experts layer whose experts are split across ranks, each token sent to its experts'
rank and back with all_to_all_single, checked against the same layer in one process.

    torchrun --standalone --nproc-per-node=2 expert_parallel.py --experts 4 --top-k 2 --capacity-factor 1.25
                                                                [--tokens 16] [--dp 1] [--skew 0]

Each rank routes its own --tokens tokens (router, softmax, top-k) and keeps at most capacity = ceil(C * tokens * k / E)
of them per expert, in token order: the rest are dropped (only the residual passes). --dp D keeps D copies of the
experts (a D x world/D mesh). Checked against one process running the layer on every rank's tokens: the outputs, the
gradients, one SGD step, and which tokens were dropped. --skew S adds S to expert 0's router logit.
"""
import argparse
import copy
import json
import math
import os

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd  # all_to_all with a backward
from torch.distributed.device_mesh import init_device_mesh

import ddp_common  # a clean exit, and the device

parser = argparse.ArgumentParser()
parser.add_argument("--experts", type=int, default=4, help="E, a multiple of the expert-parallel ranks")
parser.add_argument("--top-k", type=int, default=2, help="the experts each token goes to")
parser.add_argument("--capacity-factor", type=float, default=1.25, help="C: capacity = ceil(C * tokens * k / E)")
parser.add_argument("--tokens", type=int, default=16, help="the tokens each rank routes")
parser.add_argument("--dim", type=int, default=8)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--dp", type=int, default=1, help="copies of the experts (data-parallel replicas)")
parser.add_argument("--skew", type=float, default=0.0, help="added to expert 0's router logit: it takes most tokens")
options = parser.parse_args()
E, K, T, D, DP = options.experts, options.top_k, options.tokens, options.dim, options.dp
WORLD = int(os.environ["WORLD_SIZE"])
if DP < 1 or WORLD % DP:
    parser.error(f"--dp {DP} must divide the {WORLD} ranks")
EP = WORLD // DP  # the ranks that share one copy of the experts
if E % EP:
    parser.error(f"--experts {E} must be a multiple of the {EP} expert-parallel ranks ({WORLD} ranks / --dp {DP})")
if not 1 <= K <= E:
    parser.error(f"--top-k {K} must be between 1 and --experts {E}")
CAPACITY, LOCAL, BALANCE_WEIGHT = math.ceil(options.capacity_factor * T * K / E), E // EP, 0.01

backend, device = ddp_common.backend_and_device()
dist.init_process_group(backend)
rank = dist.get_rank()
mesh = init_device_mesh(device.type, (DP, EP), mesh_dim_names=("dp", "ep"))  # rank = dp index * EP + ep index
ep_group, dp_group, ep_rank = mesh.get_group("ep"), mesh.get_group("dp"), mesh.get_local_rank("ep")
mine = range(ep_rank * LOCAL, (ep_rank + 1) * LOCAL)  # this rank's experts: E / EP consecutive ones

# The whole layer, the same on every rank (same seed): the reference keeps every expert, this rank its slice.
torch.manual_seed(options.seed)
router = torch.nn.Linear(D, E, bias=False)
experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.Tanh(), torch.nn.Linear(2 * D, D))
                              for _ in range(E))
tokens, targets = torch.randn(WORLD, T, D), torch.randn(WORLD, T, D)  # rank r routes tokens[r]
skew = torch.zeros(E)
skew[0] = options.skew
my_router, my_experts = copy.deepcopy(router).to(device), copy.deepcopy(experts[mine.start:mine.stop]).to(device)


def route(x, router, skew):
    """Each token's k (expert, weight) assignments in token order; which fit in capacity; the balance loss."""
    probs = torch.softmax(router(x) + skew.to(x.device), dim=-1)
    weight, expert = (t.flatten() for t in probs.topk(K, dim=-1))  # Switch's weights: the probabilities themselves
    token = torch.arange(len(x), device=x.device).repeat_interleave(K)
    queue = torch.nn.functional.one_hot(expert, E).cumsum(0).gather(1, expert[:, None]).squeeze(1) - 1
    kept = queue < CAPACITY  # an expert takes its first CAPACITY assignments, in token order; the rest are dropped
    share = torch.bincount(expert, minlength=E) / len(expert)  # before the capacity: what the router asked for
    return token, expert, weight, kept, E * (share * probs.mean(0)).sum()  # Switch/GShard: E * sum_e f_e * p_e


def moe_one_process(x, router, experts):
    token, expert, weight, kept, balance = route(x, router, skew)
    out = x  # the residual: a dropped assignment adds nothing
    for e in range(E):
        rows = kept & (expert == e)
        out = out.index_add(0, token[rows], weight[rows, None] * experts[e](x[token[rows]]))
    dropped = {(t, e) for t, e, k in zip(token.tolist(), expert.tolist(), kept.tolist()) if not k}
    return out, balance, dropped, torch.bincount(expert[kept], minlength=E)


def moe_expert_parallel(x):
    token, expert, weight, kept, balance = route(x, my_router, skew)
    dropped = {(t, e) for t, e, k in zip(token.tolist(), expert.tolist(), kept.tolist()) if not k}
    routed = torch.bincount(expert, minlength=E)
    order = torch.argsort(torch.where(kept, expert, E), stable=True)[:int(kept.sum())]  # kept ones, by expert
    token, expert, weight = token[order], expert[order], weight[order]
    # First the counts (how many rows each rank will send me, per expert of mine), then the rows themselves
    send_counts = torch.bincount(expert, minlength=E)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ep_group)
    send_splits, recv_splits = send_counts.view(EP, LOCAL).sum(1).tolist(), recv_counts.view(EP, LOCAL).sum(1).tolist()
    received = all_to_all_single_autograd(x[token], recv_splits, send_splits, ep_group)
    # From each rank in turn: its rows for my first expert, then my second...: each expert runs on its own rows
    local_expert = torch.arange(LOCAL, device=x.device).repeat(EP).repeat_interleave(recv_counts)
    by_expert = torch.argsort(local_expert, stable=True)
    rows = received[by_expert].split(torch.bincount(local_expert, minlength=LOCAL).tolist())
    outputs = torch.cat([my_experts[j](r) for j, r in enumerate(rows)])  # a GPU's torch._grouped_mm: one kernel
    outputs = outputs[torch.argsort(by_expert)]  # back in the order they arrived
    returned = all_to_all_single_autograd(outputs, send_splits, recv_splits, ep_group)  # back to their tokens' ranks
    out = x.index_add(0, token, weight[:, None] * returned)
    return out, balance, dropped, routed, recv_counts.view(EP, LOCAL).sum(0)


out, balance, dropped, routed, processed = moe_expert_parallel(tokens[rank].to(device))
loss = torch.nn.functional.mse_loss(out, targets[rank].to(device)) + BALANCE_WEIGHT * balance
loss.backward()
# The router saw this rank's tokens only: its gradient is averaged over every rank. An expert's gradient already
# sums the loss of every rank of its ep group (the backward all_to_all brought it): summed over its dp copies and
# divided by the world, it too is the gradient of the mean loss over all ranks.
for p in my_router.parameters():
    dist.all_reduce(p.grad)
    p.grad /= WORLD
for p in my_experts.parameters():
    dist.all_reduce(p.grad, group=dp_group)
    p.grad /= WORLD

# The reference: the same layer in one process, on every rank's tokens (each rank's own batch, as its capacity is)
ref = [moe_one_process(tokens[r], router, experts) for r in range(WORLD)]
torch.stack([torch.nn.functional.mse_loss(o, targets[r]) + BALANCE_WEIGHT * b
             for r, (o, b, _, _) in enumerate(ref)]).mean().backward()
if options.skew:  # the control: the same tokens and router, without the skew
    with torch.no_grad():
        plain = [route(tokens[r], router, torch.zeros(E)) for r in range(WORLD)]
    without_skew = {"dropped_tokens": sum(int((~k).sum()) for _, _, _, k, _ in plain),
                    "load_balancing_loss": round(sum(b.item() for *_, b in plain) / WORLD, 4)}
pairs = list(zip([*my_router.parameters(), *my_experts.parameters()],
                 [*router.parameters(), *experts[mine.start:mine.stop].parameters()]))
out_diff = (out.detach().cpu() - ref[rank][0].detach()).abs().max().item()
grad_diff = max((p.grad.cpu() - q.grad).abs().max().item() for p, q in pairs)
for params in ([p for p, _ in pairs], [*router.parameters(), *experts.parameters()]):
    torch.optim.SGD(params, lr=0.5).step()
step_diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in pairs)
every = [None] * WORLD
dist.all_gather_object(every, {"out": out_diff, "grad": grad_diff, "step": step_diff, "balance": balance.item(),
                               "dropped": {(rank * T + t, e) for t, e in dropped}, "routed": routed.tolist(),
                               "processed": {e: n for e, n in zip(mine, processed.tolist())}})

if rank == 0:
    ref_dropped = {(r * T + t, e) for r, (_, _, d, _) in enumerate(ref) for t, e in d}
    our_dropped = set().union(*(r["dropped"] for r in every))
    per_expert = [sum(r["processed"].get(e, 0) for r in every) for e in range(E)]
    ref_per_expert = sum(k for *_, k in ref).tolist()
    diffs = {k: max(r[k] for r in every) for k in ("out", "grad", "step")}
    balance_mean = sum(r["balance"] for r in every) / WORLD
    ref_balance = sum(b.item() for _, b, _, _ in ref) / WORLD
    same_dropped = our_dropped == ref_dropped and per_expert == ref_per_expert
    balance_matches = abs(balance_mean - ref_balance) < 1e-6
    matches = max(diffs.values()) < 1e-5 and same_dropped and balance_matches
    summary = {"world_size": WORLD, "dp": DP, "ep": EP, "experts": E, "top_k": K,
               "capacity_factor": options.capacity_factor, "tokens_per_rank": T, "capacity": CAPACITY,
               "skew": options.skew, "matches_single_process": matches, "same_tokens_dropped": same_dropped,
               "dropped_tokens": len(our_dropped), "dropped_tokens_single_process": len(ref_dropped),
               "assignments": WORLD * T * K, "max_output_diff": diffs["out"], "max_grad_diff": diffs["grad"],
               "step_matches": diffs["step"] < 1e-5, "max_param_diff_after_step": diffs["step"],
               "tokens_per_expert": per_expert, "routed_per_expert": [sum(r["routed"][e] for r in every)
                                                                      for e in range(E)],
               "load_balancing_loss": round(balance_mean, 4), "load_balancing_loss_matches": balance_matches,
               "experts_of_rank": [list(range((r % EP) * LOCAL, (r % EP + 1) * LOCAL)) for r in range(WORLD)],
               "grads_averaged_over": {"router": list(range(WORLD)), **{
                   f"experts {e * LOCAL}-{e * LOCAL + LOCAL - 1}": list(range(e, WORLD, EP)) for e in range(EP)}}}
    if options.skew:
        summary["without_skew"] = without_skew
    print(f"expert parallel ({WORLD} ranks = {DP} dp x {EP} ep, {E} experts, top-{K}, capacity {CAPACITY}): outputs, "
          f"gradients and one SGD step == one process's (max |diff| < 1e-5): {max(diffs.values()) < 1e-5}; "
          f"{len(our_dropped)} of {WORLD * T * K} assignments dropped, the same as one process: {same_dropped}")
    print("gradients summed over, then divided by the world:", "; ".join(
        f"{name} over ranks {ranks}" for name, ranks in summary["grads_averaged_over"].items()))
    print("RESULT " + json.dumps(summary))
dist.destroy_process_group()
