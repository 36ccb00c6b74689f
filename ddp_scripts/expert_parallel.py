"""Expert parallelism: a mixture-of-experts layer, its experts split across ranks, each token sent to its experts'
rank and back with all_to_all_single, checked against the same layer in one process.

    torchrun --standalone --nproc-per-node=2 expert_parallel.py --experts 4 --top-k 2 --capacity-factor 1.25
                                                                [--tokens 16] [--dp 1] [--skew 0]

An expert takes at most capacity = ceil(C * tokens * k / E) of a rank's assignments, in token order. --dp D keeps D
copies of the experts. Checked: the outputs, the gradients, one SGD step, which assignments were dropped.
"""
import argparse
import copy
import json
import math
import os

import torch
import torch.distributed as dist
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
parser.add_argument("--skew", type=float, default=0.0, help="added to expert 0's router logit")
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

# The whole layer, the same on every rank: the reference keeps every expert, this rank its slice.
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
    weight, expert = (t.flatten() for t in probs.topk(K, dim=-1))  # Switch: the probabilities are the weights
    token = torch.arange(len(x), device=x.device).repeat_interleave(K)
    queue = torch.nn.functional.one_hot(expert, E).cumsum(0).gather(1, expert[:, None]).squeeze(1) - 1
    kept = queue < CAPACITY  # first come, first kept; the rest dropped
    share = torch.bincount(expert, minlength=E) / len(expert)  # before the capacity: what the router asked for
    return token, expert, weight, kept, E * (share * probs.mean(0)).sum()  # Switch/GShard: E * sum_e f_e * p_e


def moe_one_process(x, router, experts):
    token, expert, weight, kept, balance = route(x, router, skew)
    out = x  # the residual: a dropped assignment adds nothing
    for e in range(E):
        rows = kept & (expert == e)
        out = out.index_add(0, token[rows], weight[rows, None] * experts[e](x[token[rows]]))
    routed = [(t, e) for t, e in zip(token.tolist(), expert.tolist())]
    dropped = {pair for pair, k in zip(routed, kept.tolist()) if not k}
    return out, balance, dropped, torch.bincount(expert[kept], minlength=E), set(routed)


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward sends the gradients back, the splits swapped."""

    @staticmethod
    def forward(ctx, rows, recv_splits, send_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        received = rows.new_empty(sum(recv_splits), *rows.shape[1:])
        dist.all_to_all_single(received, rows.contiguous(), recv_splits, send_splits, group=group)
        return received

    @staticmethod
    def backward(ctx, grad):
        return AllToAll.apply(grad, *ctx.splits, ctx.group), None, None, None


def moe_expert_parallel(x):
    token, expert, weight, kept, balance = route(x, my_router, skew)
    order = torch.argsort(torch.where(kept, expert, E), stable=True)[:int(kept.sum())]  # kept ones, by expert
    token, expert, weight = token[order], expert[order], weight[order]
    # First the counts (how many rows each rank will send me, per expert of mine), then the rows themselves
    send_counts = torch.bincount(expert, minlength=E)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ep_group)
    send_splits, recv_splits = send_counts.view(EP, LOCAL).sum(1).tolist(), recv_counts.view(EP, LOCAL).sum(1).tolist()
    received = AllToAll.apply(x[token], recv_splits, send_splits, ep_group)
    # Each row's (token, expert), for the record: what each expert really received
    labels = AllToAll.apply(torch.stack([rank * T + token, expert], 1), recv_splits, send_splits, ep_group)
    off_rank = sum(send_splits) - send_splits[ep_rank]  # rows that leave this rank (and come back)
    # Rows come by source rank, then by my expert: regrouped, each expert runs on its own
    local_expert = torch.arange(LOCAL, device=x.device).repeat(EP).repeat_interleave(recv_counts)
    by_expert = torch.argsort(local_expert, stable=True)
    rows = received[by_expert].split(torch.bincount(local_expert, minlength=LOCAL).tolist())
    outputs = torch.cat([my_experts[j](r) for j, r in enumerate(rows)])  # on GPUs: one grouped_mm
    outputs = outputs[torch.argsort(by_expert)]  # back in the order they arrived
    returned = AllToAll.apply(outputs, send_splits, recv_splits, ep_group)  # back to their tokens' ranks
    out = x.index_add(0, token, weight[:, None] * returned)
    return out, balance, labels.tolist(), off_rank


out, balance, arrived, off_rank = moe_expert_parallel(tokens[rank].to(device))
loss = torch.nn.functional.mse_loss(out, targets[rank].to(device)) + BALANCE_WEIGHT * balance
loss.backward()
# The router saw this rank's tokens; an expert, its ep group's already (the backward all_to_all): both / the world.
for p in my_router.parameters():
    dist.all_reduce(p.grad)
    p.grad /= WORLD
for p in my_experts.parameters():
    dist.all_reduce(p.grad, group=dp_group)
    p.grad /= WORLD
slip = [p.detach() - 0.5 * p.grad * WORLD / DP for p in my_experts.parameters()]  # the step if divided by DP

# The reference: the same layer in one process, on each rank's tokens in turn (capacity is per rank)
ref = [moe_one_process(tokens[r], router, experts) for r in range(WORLD)]
torch.stack([torch.nn.functional.mse_loss(o, targets[r]) + BALANCE_WEIGHT * b
             for r, (o, b, *_) in enumerate(ref)]).mean().backward()
if options.skew:  # the control: the same tokens and router, without the skew
    with torch.no_grad():
        plain = [route(tokens[r], router, torch.zeros(E)) for r in range(WORLD)]
    without_skew = {"dropped_tokens": sum(int((~k).sum()) for _, _, _, k, _ in plain),
                    "load_balancing_loss": round(sum(b.item() for *_, b in plain) / WORLD, 4)}
my_reference = experts[mine.start:mine.stop]  # the one-process layer's copy of this rank's experts
pairs = list(zip([*my_router.parameters(), *my_experts.parameters()],
                 [*router.parameters(), *my_reference.parameters()]))
out_diff = (out.detach().cpu() - ref[rank][0].detach()).abs().max().item()
grad_diff = max((p.grad.cpu() - q.grad).abs().max().item() for p, q in pairs)
with torch.no_grad():  # SGD by hand: torch.optim's first step imports the compiler, 1.3 s a rank
    for p in [p for p, _ in pairs] + [*router.parameters(), *experts.parameters()]:
        p -= 0.5 * p.grad
step_diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in pairs)
slip_diff = max((s.cpu() - q.detach()).abs().max().item() for s, q in zip(slip, my_reference.parameters()))
every = [None] * WORLD
dist.all_gather_object(every, {"out": out_diff, "grad": grad_diff, "step": step_diff, "balance": balance.item(),
                               "arrived": [tuple(pair) for pair in arrived], "off_rank": off_rank, "slip": slip_diff,
                               "experts": list(mine), "copies": dist.get_process_group_ranks(dp_group)})

if rank == 0:
    ref_dropped = {(r * T + t, e) for r, (_, _, d, _, _) in enumerate(ref) for t, e in d}
    ref_routed = {(r * T + t, e) for r, (*_, routed) in enumerate(ref) for t, e in routed}
    arrived = [pair for r in every for pair in r["arrived"]]
    our_dropped = ref_routed - set(arrived)  # routed, never received by its expert
    each_once_at_its_expert = len(arrived) == len(set(arrived)) and all(
        e // LOCAL == r % EP for r, result in enumerate(every) for _, e in result["arrived"])
    per_expert = torch.bincount(torch.tensor([e for _, e in arrived]), minlength=E).tolist()
    ref_per_expert = sum(k for _, _, _, k, _ in ref).tolist()
    diffs = {k: max(r[k] for r in every) for k in ("out", "grad", "step")}
    balance_mean = sum(r["balance"] for r in every) / WORLD
    same_dropped = our_dropped == ref_dropped and per_expert == ref_per_expert and each_once_at_its_expert
    matches = max(diffs.values()) < 1e-5 and same_dropped
    summary = {"world_size": WORLD, "dp": DP, "ep": EP, "experts": E, "top_k": K,
               "capacity_factor": options.capacity_factor, "tokens_per_rank": T, "capacity": CAPACITY,
               "skew": options.skew, "matches_single_process": matches, "same_tokens_dropped": same_dropped,
               "dropped_tokens": len(our_dropped), "dropped_tokens_single_process": len(ref_dropped),
               "assignments": WORLD * T * K, "max_output_diff": diffs["out"], "max_grad_diff": diffs["grad"],
               "step_matches": diffs["step"] < 1e-5,
               "tokens_per_expert": per_expert,
               "routed_per_expert": torch.bincount(torch.tensor([e for _, e in ref_routed]), minlength=E).tolist(),
               "load_balancing_loss": round(balance_mean, 4), "rows_sent_off_rank": sum(r["off_rank"] for r in every),
               "expert_step_matches_if_divided_by_copies": max(r["slip"] for r in every) < 1e-5,
               "experts_of_rank": [r["experts"] for r in every],
               "grads_averaged_over": {"router": dist.get_process_group_ranks(dist.group.WORLD), **{
                   f"experts {r['experts'][0]}-{r['experts'][-1]}": r["copies"] for r in every}}}
    if options.skew:
        summary["without_skew"] = without_skew
    print(f"{WORLD} ranks = {DP} dp x {EP} ep, {E} experts, top-{K}, capacity {CAPACITY}: outputs, gradients, one step "
          f"match one process: {max(diffs.values()) < 1e-5}; {len(our_dropped)} of {WORLD * T * K} dropped, the same "
          f"ones: {same_dropped}")
    print("RESULT " + json.dumps(summary))
dist.destroy_process_group()
