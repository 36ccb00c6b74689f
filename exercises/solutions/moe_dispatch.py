"""A solution of exercises/moe_dispatch.py: drop past capacity, exchange the counts, send; send back, weight, add."""
import torch
import torch.distributed as dist


def dispatch(tokens, expert_of_token, num_experts, capacity):
    world = dist.get_world_size()
    # each token's place in its expert's queue, in token order: the first `capacity` are kept
    place = torch.nn.functional.one_hot(expert_of_token, num_experts).cumsum(0).gather(1, expert_of_token[:, None]) - 1
    kept = torch.nonzero(place.squeeze(1) < capacity).squeeze(1)
    kept = kept[torch.argsort(expert_of_token[kept], stable=True)]  # by expert, so by rank: each rank's rows together
    send_counts = torch.bincount(expert_of_token[kept] // (num_experts // world), minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # first the counts: now each rank knows what it will receive
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    received = tokens.new_empty(sum(recv_splits), tokens.shape[1])
    dist.all_to_all_single(received, tokens[kept], recv_splits, send_splits)
    expert_of_received = expert_of_token.new_empty(sum(recv_splits))
    dist.all_to_all_single(expert_of_received, expert_of_token[kept], recv_splits, send_splits)
    return received, expert_of_received, (kept, send_splits, recv_splits)


def combine(expert_outputs, routing, tokens, weight_of_token):
    kept, send_splits, recv_splits = routing
    returned = expert_outputs.new_empty(len(kept), expert_outputs.shape[1])
    dist.all_to_all_single(returned, expert_outputs, send_splits, recv_splits)  # the way back: the splits swapped
    return tokens.index_add(0, kept, weight_of_token[kept, None] * returned)  # a dropped token: the residual alone
