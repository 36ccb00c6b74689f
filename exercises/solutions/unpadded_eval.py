"""A solution of exercises/unpadded_eval.py: each rank evaluates every world_size-th sample, and the counts are
summed over the ranks before dividing."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset


def evaluate(model: torch.nn.Module, dataset, batch_size: int) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    # rank r takes samples r, r+N, r+2N, ...: no padding, so a rank may get none at all (fewer samples than ranks)
    shard = Subset(dataset, range(rank, len(dataset), world))
    counts = torch.zeros(2, dtype=torch.long)  # correct, seen
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=batch_size):
            counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)  # every rank joins, even one with no samples
    return counts[0].item() / counts[1].item()
