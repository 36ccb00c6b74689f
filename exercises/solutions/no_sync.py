"""A solution of exercises/no_sync.py: gradient accumulation with one all-reduce per optimizer step."""
import contextlib


def train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float:
    k = len(micro_batches)
    samples = sum(len(x) for x, _ in micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        # no_sync: backward only accumulates into .grad; the last micro-batch's backward all-reduces the sum.
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            loss = loss_fn(ddp_model(x), y)
            # Each mean weighted by its share of the step's samples: the sum is the big batch's mean loss. (/ k
            # is the same only for micro-batches of one size.)
            (loss * len(x) / samples).backward()
        total += loss.item() * len(x)
    optimizer.step()
    return total / samples
