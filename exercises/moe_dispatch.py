"""Exercise (lesson 15d): send each token to the rank that holds its expert, and its output back.

Expert parallelism splits a mixture-of-experts layer's E experts across the N ranks: rank r holds experts
r * E/N .. (r + 1) * E/N - 1. Each rank routes its own tokens (the router has chosen one expert per token, with a
weight), and then:

dispatch(tokens, expert_of_token, num_experts, capacity) -> (received, expert_of_received, routing)
    Keep each expert's first `capacity` tokens of this rank, in token order; the others are dropped: not sent, and
    their output is the token itself (the residual). Send each kept token to the rank holding its expert. Return the
    rows this rank's experts must process (`received`, from every rank), the expert each row is for (its number,
    0 .. E - 1), and whatever combine() will need (`routing`: your choice).
combine(expert_outputs, routing, tokens, weight_of_token) -> output
    `expert_outputs` are the experts' outputs for `received`, row for row. Send each back to the rank its token came
    from, and return tokens + weight * expert output for each kept token (the token alone for a dropped one).

Each rank sends a different number of rows to each rank (some none): dist.all_to_all_single(output, input,
output_split_sizes, input_split_sizes) takes uneven splits, but a rank cannot know what it will receive until it
is told: exchange the counts first. The check runs dispatch and combine at 2, 3 and 4 ranks, with 1 and 2 experts a
rank, uneven and skewed routings and full experts; it identifies every row that arrives, runs the experts itself,
and compares combine's output with the same layer in one process.

Check it:   python -m lessons check moe_dispatch
"""
import torch
import torch.distributed as dist


def dispatch(tokens: torch.Tensor, expert_of_token: torch.Tensor, num_experts: int, capacity: int):
    # TODO 1: which tokens does each expert keep? (its first `capacity`, in token order)
    # TODO 2: the kept tokens ordered by the rank of their expert: how many rows go to each rank?
    # TODO 3: tell every rank how many rows it will receive from you (an all_to_all_single of the counts), then send
    #         the rows (and the expert each is for) with those split sizes
    raise NotImplementedError("return (received, expert_of_received, routing)")


def combine(expert_outputs: torch.Tensor, routing, tokens: torch.Tensor, weight_of_token: torch.Tensor):
    # TODO: send the outputs back (the same splits, the other way), then add weight * output to each kept token
    raise NotImplementedError("return the output of every token of this rank")
