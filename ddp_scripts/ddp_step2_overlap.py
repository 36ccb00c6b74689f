"""DDP from scratch, step 2: start each gradient's all-reduce during backward, as soon as it is ready."""
import time

import torch.distributed as dist

from ddp_step1_naive import broadcast_parameters


class OverlapDDP:
    def __init__(self, model):
        self.model = model
        broadcast_parameters(model)
        self.pending = []
        self.launched_at = []  # when each all-reduce started, to show the overlap
        for p in model.parameters():
            if p.requires_grad:  # frozen: no gradient, no hook
                p.register_post_accumulate_grad_hook(self.start_all_reduce)

    def start_all_reduce(self, p):  # runs *during* backward, once p.grad is final
        self.launched_at.append(time.perf_counter())
        self.pending.append((p, dist.all_reduce(p.grad, async_op=True)))  # returns at once

    def finish_gradients(self):  # call after backward(), before optimizer.step()
        for p, work in self.pending:
            work.wait()
            p.grad /= dist.get_world_size()
        self.pending.clear()
