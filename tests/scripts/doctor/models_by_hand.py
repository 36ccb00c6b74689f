"""Models the doctor must tell apart by what their parameters are, not by whether they differed at the start.

    torchrun --standalone --nproc-per-node=2 models_by_hand.py [--wrap none|fsdp1|fully-shard] [--first-weights same|per-rank]
        [--average-grads] [--log-loss] [--dropout P] [--seed-per-rank] [--steps K]

--wrap none: no DDP. With --first-weights per-rank (each rank draws its own first weights, as an unseeded script does) and
--log-loss (an all-reduce of the logged loss, as the template makes) every rank trains a model of its own: the
costliest mistake. With --average-grads (the gradients all-reduced by hand after backward, from one seed) it is
correct. --wrap fsdp1 / fully-shard shard the model (each rank holds its own part of the parameters, by design);
--dropout with one seed everywhere draws the same masks on every rank, --seed-per-rank is the fix.
"""
import argparse
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--wrap", choices=["none", "fsdp1", "fully-shard"], default="none")
parser.add_argument("--first-weights", choices=["same", "per-rank"], default="same")
parser.add_argument("--average-grads", action="store_true")
parser.add_argument("--log-loss", action="store_true")
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--seed-per-rank", action="store_true")
parser.add_argument("--steps", type=int, default=6)
options = parser.parse_args()

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank if options.first_weights == "per-rank" else 0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(options.dropout),
                            torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
if options.wrap == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    model = FSDP(model, auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=100),
                 device_id=torch.device("cpu"))
elif options.wrap == "fully-shard":
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
if options.seed_per_rank:
    torch.manual_seed(1000 + rank)  # after the model: each rank its own dropout masks
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(7)
inputs, targets = torch.randn(64, 6, generator=data), torch.randn(64, 1, generator=data)
mine_x, mine_y = inputs[rank::world_size], targets[rank::world_size]  # each rank its own samples
for step in range(options.steps):
    rows = slice(step * 8 % len(mine_x), step * 8 % len(mine_x) + 8)
    x, y = mine_x[rows], mine_y[rows]
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    if options.average_grads:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
    optimizer.step()
    if options.log_loss:
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0 and step == options.steps - 1:
            print(f"mean loss {logged.item() / world_size:.3f}")
dist.destroy_process_group()
