"""Lesson 03's DDPs from scratch and lesson 12b's ShardedAdamW on a model with a frozen layer and a tied weight,
against torch: DDP with SGD, and one process with AdamW (weight decay, other betas) on the whole batch.

    torchrun --standalone --nproc-per-node=2 tests/scripts/frozen_and_tied.py DDP_SCRIPTS_DIR
"""
import json
import sys

sys.path.insert(0, sys.argv[1])  # the course's ddp_scripts/

import ddp_common  # noqa: E402  before init_process_group
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ddp_step1_naive import NaiveDDP  # noqa: E402
from ddp_step2_overlap import OverlapDDP  # noqa: E402
from ddp_step3_bucketed import BucketedDDP  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from zero_by_hand import ShardedAdamW  # noqa: E402

STEPS = 3


class TiedAndFrozen(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)  # e.g. a pretrained layer kept as it is
        self.hidden = nn.Linear(8, 8)
        self.out = nn.Linear(8, 10, bias=False)
        self.out.weight = self.embed.weight  # tied: one parameter, used twice

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.frozen(self.embed(tokens)))))


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, 10, (6,), generator=g), torch.randint(0, 10, (6,), generator=g)


def train(model, optimizer, steps, tokens, targets, finish=None):
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(tokens), targets).backward()
        if finish:
            finish()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens, targets = batch(rank)
    ddp = DDP(TiedAndFrozen())
    reference = train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.5), STEPS, tokens, targets)
    diffs = {}
    buckets = {}
    for name, wrap in (("naive", NaiveDDP), ("overlap", OverlapDDP), ("bucketed", lambda m: BucketedDDP(m, 25)),
                       ("bucket_per_parameter", lambda m: BucketedDDP(m, 1e-6))):  # a cap below any parameter
        model = TiedAndFrozen()
        wrapper = wrap(model)
        ours = train(model, torch.optim.SGD(model.parameters(), lr=0.5), STEPS, tokens, targets,
                     wrapper.finish_gradients)
        diffs[name] = (ours - reference).abs().max().item()
        buckets[name] = len(getattr(wrapper, "buckets", []))

    model = TiedAndFrozen()
    kwargs = {"lr": 0.05, "betas": (0.8, 0.95), "weight_decay": 0.1}
    sharded = ShardedAdamW(model, torch.optim.AdamW, **kwargs)
    ours = train(model, sharded, STEPS, tokens, targets)
    everything = [batch(r) for r in range(world)]  # one process, the whole batch: the mean of the ranks' means
    whole = TiedAndFrozen()
    one_process = train(whole, torch.optim.AdamW(whole.parameters(), **kwargs), STEPS,
                        torch.cat([t for t, _ in everything]), torch.cat([y for _, y in everything]))
    diffs["sharded_adamw"] = (ours - one_process).abs().max().item()
    frozen_kept = torch.equal(model.frozen.weight, TiedAndFrozen().frozen.weight)
    if rank == 0:
        print("RESULT " + json.dumps({"max_abs_diff": diffs, "frozen_unchanged": frozen_kept, "buckets": buckets,
                                      "trainable": sum(p.requires_grad for p in model.parameters()),
                                      "tied": model.out.weight is model.embed.weight}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
