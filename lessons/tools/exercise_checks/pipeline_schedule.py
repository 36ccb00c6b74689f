"""Check of exercises/pipeline_schedule.py: one_f_one_b(stage, num_stages, microbatches), the order of forwards and
backwards one pipeline stage runs.

Before any launch (lessons/tools/check.py) the orders of every stage are read at 2 and 4 stages: a micro-batch lost
or run twice, a backward before its forward, a deadlock, more activations held than 1F1B holds, more steps
than 1F1B takes (pipeline_orders.py). Here, on real ranks: each stage runs its order with send/recv (a stage of a seeded MLP per
rank, 4 micro-batches), and its gradients must equal the whole MLP's in one process, at 2 and 4 stages.
"""
import copy

import torch
import torch.distributed as dist

from common import all_ranks, call, case, fail, load_learner, passed, start, worlds
from pipeline_orders import order_mistake

MICROBATCHES, BATCH, WIDTH = 4, 8, 16


def run(order, stage, rank, n, x_mbs, y_mbs):
    """The stage's forwards and backwards in the learner's order: recv blocks, isend doesn't (as in lesson 15b)."""
    stash, sends, shape = {}, [], (BATCH // MICROBATCHES, WIDTH)
    for kind, m in order:
        if kind == "F":
            inp = x_mbs[m] if rank == 0 else torch.empty(shape)
            if rank > 0:
                dist.recv(inp, src=rank - 1, tag=m)
                inp.requires_grad_()
            out = stage(inp)
            if rank == n - 1:
                out = torch.nn.functional.mse_loss(out, y_mbs[m]) / MICROBATCHES
            else:
                sends.append(dist.isend(out.detach(), dst=rank + 1, tag=m))
            stash[m] = (inp, out)
        else:
            inp, out = stash.pop(m)
            grad = None if rank == n - 1 else torch.empty(shape)
            if grad is not None:
                dist.recv(grad, src=rank + 1, tag=MICROBATCHES + m)
            out.backward(grad)
            if rank > 0:
                sends.append(dist.isend(inp.grad, dst=rank - 1, tag=MICROBATCHES + m))
    for work in sends:
        work.wait()


def main():
    start()
    learner = load_learner("one_f_one_b")
    for n in worlds(2, 4):
        case(f"{n} stages, {MICROBATCHES} micro-batches")
        rank = dist.get_rank()
        order = call(learner.one_f_one_b, rank, n, MICROBATCHES)
        mistake = order_mistake(all_ranks(order), MICROBATCHES)  # the launch may read another file than the check
        if mistake:
            fail(mistake)
        torch.manual_seed(0)
        whole = torch.nn.Sequential(*[m for _ in range(2 * n) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())])
        stage = copy.deepcopy(whole[4 * rank: 4 * rank + 4])
        x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
        torch.nn.functional.mse_loss(whole(x), y).backward()
        run(order, stage, rank, n, x.chunk(MICROBATCHES), y.chunk(MICROBATCHES))
        diff = max((p.grad - q.grad).abs().max().item()
                   for p, q in zip(stage.parameters(), whole[4 * rank: 4 * rank + 4].parameters()))
        if diff > 1e-6:
            fail(f"stage {rank}'s gradients differ from one process's by {diff:.2g} with {n} stages: every micro-batch's"
                 " loss counts 1/M of the batch's, once")
    passed(f"2 and 4 stages, {MICROBATCHES} micro-batches: no deadlock, every micro-batch once, at most N - s "
           "activations held on stage s, as few steps as 1F1B, and every stage's gradients equal one process's")


if __name__ == "__main__":
    main()
