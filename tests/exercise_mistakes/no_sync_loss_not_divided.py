"""A typical wrong answer to no_sync: one all-reduce per step, but each micro-batch's loss is not divided by k."""
import contextlib


def train_step(ddp_model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == len(micro_batches) - 1 else ddp_model.no_sync():
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
        total += loss.item()
    optimizer.step()
    return total / len(micro_batches)
