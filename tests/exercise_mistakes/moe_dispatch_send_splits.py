"""A typical wrong answer to exercises/moe_dispatch.py: the counts are never exchanged, so each rank receives with
its own send splits, as if every rank sent it what it sends them."""
import torch
import torch.distributed as dist


def dispatch(tokens, expert_of_token, num_experts, capacity):
    world = dist.get_world_size()
    place = torch.nn.functional.one_hot(expert_of_token, num_experts).cumsum(0).gather(1, expert_of_token[:, None]) - 1
    kept = torch.nonzero(place.squeeze(1) < capacity).squeeze(1)
    kept = kept[torch.argsort(expert_of_token[kept], stable=True)]
    splits = torch.bincount(expert_of_token[kept] // (num_experts // world), minlength=world).tolist()
    received = tokens.new_empty(sum(splits), tokens.shape[1])
    dist.all_to_all_single(received, tokens[kept], splits, splits)  # the mistake: the receive splits are not known
    expert_of_received = expert_of_token.new_empty(sum(splits))
    dist.all_to_all_single(expert_of_received, expert_of_token[kept], splits, splits)
    return received, expert_of_received, (kept, splits)


def combine(expert_outputs, routing, tokens, weight_of_token):
    kept, splits = routing
    returned = expert_outputs.new_empty(len(kept), expert_outputs.shape[1])
    dist.all_to_all_single(returned, expert_outputs, splits, splits)
    return tokens.index_add(0, kept, weight_of_token[kept, None] * returned)
