"""A typical wrong answer to no_sync: each micro-batch's mean loss divided by k, right only for equal micro-batches."""
import contextlib


def train_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else ddp_model.no_sync():
            loss = loss_fn(ddp_model(x), y)
            (loss / k).backward()
        total += loss.item()
    optimizer.step()
    return total / k
