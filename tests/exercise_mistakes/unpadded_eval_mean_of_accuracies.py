"""A typical wrong answer to unpadded_eval: every sample counted once, but the ranks' accuracies are averaged,
which weighs a small shard as much as a large one."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset


def evaluate(model, dataset, batch_size):
    rank, world = dist.get_rank(), dist.get_world_size()
    correct, seen = 0, 0
    with torch.no_grad():
        for x, y in DataLoader(Subset(dataset, range(rank, len(dataset), world)), batch_size=batch_size):
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    accuracy = torch.tensor([correct / seen if seen else 0.0])
    dist.all_reduce(accuracy)
    return accuracy.item() / world
