"""Check of exercises/no_sync.py: train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float accumulates
gradients over k micro-batches with exactly one all-reduce per step.

At 3 ranks, k = 1, 3 micro-batches of 4 samples, and 2 of 5 and 3 samples, two steps each. A comm hook counts DDP's
all-reduces (this model fits in one bucket: one all-reduce per synchronised backward). The gradients at
optimizer.step() are compared with one big batch's (the micro-batches concatenated, through DDP's average over
ranks), computed beforehand on a copy of the model.
"""
import copy

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from common import call, case, fail, load_learner, passed, start, worlds

all_reduces = 0


def counting_hook(state, bucket):
    global all_reduces
    all_reduces += 1
    return default_hooks.allreduce_hook(None, bucket)


def big_batch_gradients(module, micro_batches, loss_fn):
    """One batch of all the micro-batches, averaged over ranks as DDP would: what accumulation must reproduce."""
    reference = copy.deepcopy(module)
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss = loss_fn(reference(x), y)
    loss.backward()
    grads = []
    for p in reference.parameters():
        dist.all_reduce(p.grad)
        grads.append(p.grad / dist.get_world_size())
    return grads, loss.item()


def mean_of_micro_batch_means(module, micro_batches, loss_fn):
    """What dividing each micro-batch's mean loss by k gives: right only when the micro-batches are equal."""
    reference = copy.deepcopy(module)
    for x, y in micro_batches:
        (loss_fn(reference(x), y) / len(micro_batches)).backward()
    grads = []
    for p in reference.parameters():
        dist.all_reduce(p.grad)
        grads.append(p.grad / dist.get_world_size())
    return grads


def close(a, b):
    return all(torch.allclose(g, h, rtol=1e-4, atol=1e-7) for g, h in zip(a, b))


def main():
    global all_reduces
    start()
    learner = load_learner("train_step")
    for n in worlds(3):
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
        model.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        at_step = {}
        real_step = optimizer.step

        def step(*args, **kwargs):  # what the gradients are when the optimizer uses them
            at_step["grads"] = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in
                                model.module.parameters()]
            return real_step(*args, **kwargs)
        optimizer.step = step
        loss_fn = torch.nn.functional.mse_loss
        previous = None
        for sizes in ((4,), (4, 4, 4), (5, 3)):
            k = len(sizes)
            for number in (1, 2):
                case(f"{n} ranks, k = {k} micro-batches of {sizes} samples, step {number}")
                generator = torch.Generator().manual_seed(100 * k + 10 * number + rank + sum(sizes))
                micro_batches = [(torch.randn(b, 5, generator=generator), torch.randn(b, 2, generator=generator))
                                 for b in sizes]
                expected, expected_loss = big_batch_gradients(model.module, micro_batches, loss_fn)
                by_k = mean_of_micro_batch_means(model.module, micro_batches, loss_fn)
                all_reduces = 0
                at_step.clear()
                returned = call(learner.train_step, model, optimizer, micro_batches, loss_fn)
                where = f"(3 ranks, k = {k})" if len(set(sizes)) == 1 else f"(3 ranks, micro-batches of {sizes[0]} " \
                    f"and {sizes[1]} samples)"
                if all_reduces != 1:
                    if k > 1 and all_reduces == k:
                        fail(f"{k} all-reduces per step {where}: the forward and backward of the first k-1 "
                             "micro-batches must be inside ddp_model.no_sync()")
                    if all_reduces == 0:
                        fail(f"0 all-reduces per step {where}: the last micro-batch must run outside no_sync, or "
                             "the gradients are never averaged over the ranks")
                    fail(f"{all_reduces} all-reduces per step {where}; one step needs exactly one")
                if "grads" not in at_step:
                    fail(f"train_step did not call optimizer.step() {where}")
                got = at_step["grads"]
                if not close(got, expected):
                    if k > 1 and close(got, [k * g for g in expected]):
                        fail(f"gradient {k}x too large {where}: divide each micro-batch's loss by k")
                    if len(set(sizes)) > 1 and close(got, by_k):
                        fail(f"each micro-batch's mean loss divided by k {where}: a sample of the small one then "
                             f"counts {sizes[0]}/{sizes[1]} times as much; scale each by its share of the step's "
                             "samples, len(x) / (samples in all the micro-batches)")
                    if previous is not None and close(got, [g + h for g, h in zip(expected, previous)]):
                        fail(f"the last step's gradients were still there {where}: call optimizer.zero_grad() "
                             "once per step")
                    worst = max((g - h).abs().max().item() for g, h in zip(got, expected))
                    fail(f"gradients differ from one big batch's {where} (max |diff| {worst:.3g})")
                previous = got
                tolerance = 1e-5 * max(1.0, abs(expected_loss))
                if not isinstance(returned, (float, int)) or abs(returned - expected_loss) > tolerance:
                    fail(f"train_step returned {returned!r} {where}; the mean loss over this rank's samples of "
                         f"the step was {expected_loss:.6f} (return the unscaled loss, averaged over the samples, "
                         "as a float)")
    passed("3 ranks, k = 1, 3, and 2 unequal micro-batches: one all-reduce per step (counted with a comm hook), "
           "gradients equal to one big batch's, the mean loss returned")


if __name__ == "__main__":
    main()
