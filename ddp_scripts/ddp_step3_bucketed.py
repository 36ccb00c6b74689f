"""DDP from scratch, step 3: pack gradients into flat buckets; all-reduce a bucket as soon as it is full."""
import torch
import torch.distributed as dist

from ddp_step1_naive import broadcast_parameters


class BucketedDDP:
    def __init__(self, model, bucket_mb):
        self.model = model
        broadcast_parameters(model)
        cap = bucket_mb * 2**20
        # Gradients arrive roughly in reverse order of definition: bucket them that way.
        self.buckets, current, size = [], [], 0
        for p in reversed([p for p in model.parameters() if p.requires_grad]):  # frozen: no gradient, no bucket
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        self.buckets.append(current)
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                     for b in self.buckets]
        self.where = {}  # parameter -> (bucket index, offset in its flat buffer)
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.where[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self.gradient_ready)
        self.ready = [0] * len(self.buckets)
        self.pending = {}

    def gradient_ready(self, p):
        i, offset = self.where[p]
        self.flat[i][offset: offset + p.numel()].copy_(p.grad.reshape(-1))  # reshape: grads may be non-contiguous
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):  # bucket full: send it now
            self.pending[i] = dist.all_reduce(self.flat[i], async_op=True)

    def finish_gradients(self):  # call after backward(), before optimizer.step()
        unsent = [i for i in range(len(self.buckets)) if i not in self.pending]
        if unsent:  # a parameter got no gradient: its bucket never filled, and the ranks would drift apart
            names = {p: n for n, p in self.model.named_parameters()}
            waiting = [names[p] for i in unsent for p in self.buckets[i] if p.grad is None]
            raise RuntimeError(f"bucket(s) {unsent} never became ready: no gradient for {waiting} in this "
                               "backward. torch's DDP raises too; use every parameter, or find_unused_parameters=True.")
        for i, work in self.pending.items():
            work.wait()
            self.flat[i] /= dist.get_world_size()
            for p in self.buckets[i]:
                _, offset = self.where[p]
                p.grad.copy_(self.flat[i][offset: offset + p.numel()].view_as(p.grad))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
