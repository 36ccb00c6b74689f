"""DDP from scratch, step 1: broadcast the weights once, then all-reduce every gradient after backward()."""
import time

import torch.distributed as dist


def broadcast_parameters(model):
    """What DDP does at construction: every rank starts from rank 0's weights."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=0)


class NaiveDDP:
    def __init__(self, model):
        self.model = model
        broadcast_parameters(model)
        self.launched_at = []  # when each all-reduce started, to compare with step 2

    def finish_gradients(self):  # call after backward(), before optimizer.step()
        for p in self.model.parameters():
            if p.grad is None:  # frozen, or unused in this step (on every rank): skipped, as torch does
                continue
            self.launched_at.append(time.perf_counter())
            dist.all_reduce(p.grad)  # the sum over ranks ...
            p.grad /= dist.get_world_size()  # ... divided by N: the mean
