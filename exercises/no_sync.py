"""Exercise (lesson 09): gradient accumulation with DDP's no_sync, one all-reduce per step.

Define train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float. `micro_batches` is a list of k
(x, y) pairs, not always of one size. One call is one optimizer step: the gradient must equal one big batch's (all
k micro-batches at once), DDP must all-reduce exactly once (not k times), and it returns the big batch's mean loss
(unscaled: the mean over all the step's samples), as a float. `loss_fn` returns a micro-batch's mean loss.

The check runs it at 3 ranks with k = 1, k = 3 equal micro-batches, and 2 micro-batches of 5 and 3 samples, and
counts the all-reduces with a comm hook.

Check it:   python -m lessons check no_sync
"""


def train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float:
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for x, y in micro_batches:
        # TODO 1: all micro-batches but the last inside `with ddp_model.no_sync():` (no all-reduce there).
        # TODO 2: scale each loss so that the accumulated gradient is the big batch's mean (with micro-batches of
        #         5 and 3 samples, is dividing by k right?), and return the big batch's mean loss.
        loss = loss_fn(ddp_model(x), y)
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total / k
