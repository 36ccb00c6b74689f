"""Check of exercises/moe_dispatch.py: dispatch() sends each kept token to the rank of its expert, combine() brings
the experts' outputs back, weighted, at 2, 3 and 4 ranks.

Every rank can make every rank's tokens (seeded), so the check identifies each row that arrives: from which rank,
which token, for which expert, and whether that token should have been dropped. It runs the experts itself (a
seeded tanh(x W_e) + e each) and compares combine's output with the same layer in one process. Every
all_to_all_single the learner calls is checked first: a rank must receive, from each rank, what that rank sends it
(gloo aborts on a mismatch). Each verdict is every rank's: the first rank with a problem names it, for all.
"""
import functools
import inspect
import math
from collections import Counter

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional

from common import ExerciseFailure, all_ranks, call, case, fail, load_learner, passed, start, worlds

WIDTH = 4
CASES = [  # (experts per rank, tokens per rank, capacity factor, routing): capacity = ceil(C * tokens / experts)
    (1, 13, 1.0, "random"),
    (2, 7, 1.0, "random"),
    (2, 9, 1.25, "skewed"),  # rank 0's tokens all go to the last expert: it sends nothing to the other ranks
]


def splits_agree(output_rows, input_rows, output_splits, input_splits, group):
    """Before the collective runs: does each rank receive, from each rank, what that rank sends it?"""
    n = dist.get_world_size(group)
    sends = list(input_splits) if input_splits else [input_rows // n] * n
    receives = list(output_splits) if output_splits else [output_rows // n] * n
    every = [None] * n
    dist.all_gather_object(every, (sends, receives), group=group)
    for rank, (_, wanted) in enumerate(every):
        sent_to_it = [every[source][0][rank] for source in range(n)]
        if wanted != sent_to_it:
            raise ExerciseFailure(
                f"rank {rank} receives with output_split_sizes {wanted}, but the ranks send it {sent_to_it} rows, "
                f"with {n} ranks: a rank cannot know what it will receive from what it sends; exchange the counts "
                "first (an all_to_all_single of the counts), then receive with them")


def checked(real, functional_form=False):
    """real, unchanged, after splits_agree(): the learner's file sees the same name, signature and result."""
    signature = inspect.signature(real)

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        group = a.get("group")
        if group is None or isinstance(group, dist.ProcessGroup):  # else (a mesh, a list of ranks): not checked
            if functional_form:
                splits_agree(a["self"].shape[0], a["self"].shape[0], a["output_split_sizes"],
                             a["input_split_sizes"], group)
            else:
                splits_agree(a["output"].shape[0], a["input"].shape[0], a["output_split_sizes"],
                             a["input_split_sizes"], group)
        return real(*args, **kwargs)
    return wrapper


def tokens_of(n, index, rank, experts, count, routing):
    """Rank `rank`'s tokens, their experts and weights in case `index` at n ranks: any rank can make any rank's."""
    g = torch.Generator().manual_seed(1000 * n + 10 * index + rank)
    tokens, expert, weight = torch.randn(count, WIDTH, generator=g), torch.randint(experts, (count,), generator=g), \
        torch.rand(count, generator=g)
    if routing == "skewed" and rank == 0:
        expert[:] = experts - 1
    return tokens, expert, weight


def kept_mask(expert, experts, capacity):
    return torch.nn.functional.one_hot(expert, experts).cumsum(0).gather(1, expert[:, None]).squeeze(1) <= capacity


def run_experts(rows, expert, weights):
    return torch.tanh(torch.bmm(rows[:, None, :], weights[expert]).squeeze(1)) + expert[:, None]


def arrival_problem(received, expert_of_received, every, mine, capacity, rank, n):
    """What is wrong with the rows that reached this rank, or None."""
    if not (isinstance(received, torch.Tensor) and received.dim() == 2 and received.shape[1] == WIDTH
            and isinstance(expert_of_received, torch.Tensor) and expert_of_received.shape == (len(received),)):
        return (f"dispatch() must return (received, expert_of_received, routing): rows of {WIDTH} features and one "
                f"expert number per row; rank {rank} returned {type(received).__name__} "
                f"{tuple(getattr(received, 'shape', ()))} and {tuple(getattr(expert_of_received, 'shape', ()))}")
    where = {tuple(t.tolist()): (source, i) for source, (tokens, _, _) in enumerate(every)
             for i, t in enumerate(tokens)}
    arrived = []
    for row, said in zip(received.tolist(), expert_of_received.tolist()):
        if tuple(row) not in where:
            return (f"rank {rank} received a row that is no token of any rank, with {n} ranks: send the tokens as "
                    "they are")
        source, i = where[tuple(row)]
        expert = every[source][1][i].item()
        if expert not in mine:
            return (f"token {i} of rank {source}, for expert {expert}, arrived at rank {rank}, which holds experts "
                    f"{mine.start}-{mine.stop - 1} ({n} ranks): rank r holds experts r * E/N .. (r + 1) * E/N - 1")
        if said != expert:
            return f"expert_of_received says {said} for token {i} of rank {source}, whose expert is {expert}"
        arrived.append((source, i))
    if len(set(arrived)) < len(arrived):
        twice = next(a for a, k in Counter(arrived).items() if k > 1)
        return f"token {twice[1]} of rank {twice[0]} arrived at rank {rank} twice ({n} ranks)"
    for source, (_, expert, _) in enumerate(every):
        keep = kept_mask(expert, len(every) * len(mine), capacity)
        for e in mine:
            sent = [i for s, i in arrived if s == source and expert[i] == e]
            should = [i for i in range(len(expert)) if expert[i] == e and keep[i]]
            if len(sent) > capacity:
                return (f"expert {e} on rank {rank} received {len(sent)} tokens from rank {source}, and its capacity "
                        f"is {capacity} ({n} ranks): a token past its expert's capacity is dropped: not sent, and its "
                        "output is the token itself (the residual)")
            if sorted(sent) != should:
                wrong = sorted(set(sent) - set(should)) or sorted(set(should) - set(sent))
                return (f"expert {e} on rank {rank} received tokens {sorted(sent)} of rank {source}, where one process "
                        f"keeps {should} (capacity {capacity}, {n} ranks; token {wrong[0]} differs): each expert keeps "
                        "its first `capacity` tokens, in token order, and every kept token is sent once")
    return None


def output_problem(out, tokens, expert, weight, kept, expert_weights, rank, n):
    expected = tokens.clone()
    outputs = run_experts(tokens[kept], expert[kept], expert_weights)
    expected[kept] += weight[kept, None] * outputs
    if not isinstance(out, torch.Tensor) or out.shape != tokens.shape:
        return (f"combine() must return one row per token of this rank, {tuple(tokens.shape)}; rank {rank} returned "
                f"{tuple(getattr(out, 'shape', ())) or type(out).__name__}")
    out = out.detach()
    if torch.allclose(out, expected, atol=1e-6):
        return None
    unweighted = tokens.clone()
    unweighted[kept] += outputs
    if torch.allclose(out, unweighted, atol=1e-6):
        return (f"the experts' outputs were added without the router's weights (rank {rank}, {n} ranks): combine must "
                "add weight_of_token * output, the gate that lets the router's gradient flow")
    if not torch.allclose(out[~kept], tokens[~kept], atol=1e-6):
        i = torch.nonzero(~kept)[0].item()
        return (f"token {i} of rank {rank} was dropped (expert {expert[i].item()} was full) but its output is not the "
                f"token itself ({n} ranks): a dropped token adds nothing, the residual passes")
    i = torch.nonzero((out - expected).abs().amax(1) > 1e-6)[0].item()
    return (f"combine's output for token {i} of rank {rank} (expert {expert[i].item()}) differs from one process's by "
            f"{(out[i] - expected[i]).abs().max().item():.3g} with {n} ranks: send each output back to its token's rank"
            ", the splits swapped, and add weight * output to the token")


def verdict(problem):
    """Every rank fails with the first rank's problem, or none fails."""
    problems = [p for p in all_ranks(problem) if p]
    if problems:
        fail(problems[0])


def main():
    start()
    dist.all_to_all_single = checked(dist.all_to_all_single)  # before the learner's file binds the names
    functional.all_to_all_single = checked(functional.all_to_all_single, functional_form=True)
    functional.all_to_all_single_autograd = checked(functional.all_to_all_single_autograd, functional_form=True)
    learner = load_learner("dispatch", "combine")
    for n in worlds(2, 3, 4):
        rank = dist.get_rank()
        for index, (per_rank, count, factor, routing) in enumerate(CASES):
            experts = per_rank * n
            capacity = math.ceil(factor * count / experts)
            case(f"{n} ranks, {experts} experts, {count} tokens a rank, capacity {capacity}, {routing} routing")
            every = [tokens_of(n, index, r, experts, count, routing) for r in range(n)]
            tokens, expert, weight = every[rank]
            expert_weights = torch.randn(experts, WIDTH, WIDTH, generator=torch.Generator().manual_seed(index))
            answer = call(learner.dispatch, tokens.clone(), expert.clone(), experts, capacity)
            if not (isinstance(answer, tuple) and len(answer) == 3):
                fail(f"dispatch() must return (received, expert_of_received, routing), not {type(answer).__name__}")
            received, expert_of_received, routing_state = answer
            mine = range(rank * per_rank, (rank + 1) * per_rank)
            verdict(arrival_problem(received, expert_of_received, every, mine, capacity, rank, n))
            outputs = run_experts(received.detach(), expert_of_received.long(), expert_weights)
            out = call(learner.combine, outputs, routing_state, tokens.clone(), weight.clone())
            verdict(output_problem(out, tokens, expert, weight, kept_mask(expert, experts, capacity),
                                   expert_weights, rank, n))
    passed("2, 3 and 4 ranks; 1 and 2 experts a rank; 13, 7 and 9 tokens a rank, some past capacity; a rank that "
           "sends nothing to most: every split agreed, every kept token arrived once at its expert's rank, none "
           "dropped; combine's output equals one process's")


if __name__ == "__main__":
    main()
