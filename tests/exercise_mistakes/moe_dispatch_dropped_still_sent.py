"""A typical wrong answer to exercises/moe_dispatch.py: the capacity is never applied, so a token past its expert's
capacity is still sent, computed and added."""
import torch
import torch.distributed as dist


def dispatch(tokens, expert_of_token, num_experts, capacity):
    world = dist.get_world_size()
    kept = torch.argsort(expert_of_token, stable=True)  # the mistake: every token, none dropped
    send_counts = torch.bincount(expert_of_token[kept] // (num_experts // world), minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    received = tokens.new_empty(sum(recv_splits), tokens.shape[1])
    dist.all_to_all_single(received, tokens[kept], recv_splits, send_splits)
    expert_of_received = expert_of_token.new_empty(sum(recv_splits))
    dist.all_to_all_single(expert_of_received, expert_of_token[kept], recv_splits, send_splits)
    return received, expert_of_received, (kept, send_splits, recv_splits)


def combine(expert_outputs, routing, tokens, weight_of_token):
    kept, send_splits, recv_splits = routing
    returned = expert_outputs.new_empty(len(kept), expert_outputs.shape[1])
    dist.all_to_all_single(returned, expert_outputs, send_splits, recv_splits)
    return tokens.index_add(0, kept, weight_of_token[kept, None] * returned)
