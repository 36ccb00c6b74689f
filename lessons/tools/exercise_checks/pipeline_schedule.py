"""Check of exercises/pipeline_schedule.py: one_f_one_b(stage, num_stages, microbatches), the order of forwards and
backwards one pipeline stage runs.

Before any launch (lessons/tools/check.py) the orders of every stage are read (pipeline_orders.CASES): at 2, 3, 4, 5
and 8 stages, and with fewer micro-batches than stages (2 on 3 and 4 stages, 4 on 5 and 8): a micro-batch lost or
run twice, a warm-up longer than the micro-batches, a backward before its forward, a deadlock, more activations held
than 1F1B holds, more steps than 1F1B takes (pipeline_orders.py). The launch reads them again (it may load another
file than that reading did). Then, on real ranks, in RUNS: each stage runs its order with send/recv (a stage of a
seeded MLP per rank), and its gradients must equal the whole MLP's in one process, at 2, 3 and 4 stages with 4
micro-batches and at 3 and 4 stages with 2. (5 and 8 stages are read, not run: a rank more is a second more of
every check, for orders the reading has already judged.)
"""
import copy

import torch
import torch.distributed as dist

from common import all_ranks, call, case, fail, load_learner, passed, start, worlds
from pipeline_orders import CASES, order_mistake, read

BATCH, WIDTH = 8, 16
RUNS = {2: (4,), 3: (4, 2), 4: (4, 2)}  # stages: the micro-batch counts run on real ranks (lessons.check's nproc: 4)


def run(order, stage, rank, n, x_mbs, y_mbs):
    """The stage's forwards and backwards in the learner's order: recv blocks, isend doesn't (as in lesson 15b)."""
    microbatches = len(x_mbs)
    stash, sends, shape = {}, [], (BATCH // microbatches, WIDTH)
    for kind, m in order:
        if kind == "F":
            inp = x_mbs[m] if rank == 0 else torch.empty(shape)
            if rank > 0:
                dist.recv(inp, src=rank - 1, tag=m)
                inp.requires_grad_()
            out = stage(inp)
            if rank == n - 1:
                out = torch.nn.functional.mse_loss(out, y_mbs[m]) / microbatches
            else:
                sends.append(dist.isend(out.detach(), dst=rank + 1, tag=m))
            stash[m] = (inp, out)
        else:
            inp, out = stash.pop(m)
            grad = None if rank == n - 1 else torch.empty(shape)
            if grad is not None:
                dist.recv(grad, src=rank + 1, tag=microbatches + m)
            out.backward(grad)
            if rank > 0:
                sends.append(dist.isend(inp.grad, dst=rank - 1, tag=microbatches + m))
    for work in sends:
        work.wait()


def main():
    start()
    learner = load_learner("one_f_one_b")
    case("every stage's order read at " + ", ".join(f"{n} stages, {m} micro-batches" for n, m in CASES))
    mistake = read(learner.one_f_one_b)  # what lessons.check read before the launch, from the file loaded here
    if mistake:
        fail(mistake)
    for n in worlds(*RUNS):
        rank = dist.get_rank()
        for microbatches in RUNS[n]:
            case(f"{n} stages, {microbatches} micro-batches")
            order = call(learner.one_f_one_b, rank, n, microbatches)
            mistake = order_mistake(all_ranks(order), microbatches)  # each rank's own call, as a pipeline makes it
            if mistake:
                fail(mistake)
            torch.manual_seed(0)
            whole = torch.nn.Sequential(*[m for _ in range(2 * n)
                                          for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())])
            stage = copy.deepcopy(whole[4 * rank: 4 * rank + 4])
            x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
            torch.nn.functional.mse_loss(whole(x), y).backward()
            run(order, stage, rank, n, x.chunk(microbatches), y.chunk(microbatches))
            diff = max((p.grad - q.grad).abs().max().item()
                       for p, q in zip(stage.parameters(), whole[4 * rank: 4 * rank + 4].parameters()))
            if diff > 1e-6:
                fail(f"stage {rank}'s gradients differ from one process's by {diff:.2g} with {n} stages and "
                     f"{microbatches} micro-batches: every micro-batch's loss counts 1/M of the batch's, once")
    passed("orders read at 2, 3, 4, 5 and 8 stages, and with fewer micro-batches than stages: no deadlock, every "
           "micro-batch once, at most N - s activations held on stage s, as few steps as 1F1B; run on real ranks at "
           "2, 3 and 4 stages with 4 micro-batches, 3 and 4 with 2: every stage's gradients equal one process's")


if __name__ == "__main__":
    main()
