"""A solution of exercises/no_sync.py: gradient accumulation with one all-reduce per optimizer step."""
import contextlib


def train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float:
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        # no_sync: backward only accumulates into .grad; the last micro-batch's backward all-reduces the sum.
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            loss = loss_fn(ddp_model(x), y)
            (loss / k).backward()  # mean over the k micro-batches = one big batch's mean loss
        total += loss.item()
    optimizer.step()
    return total / k
