"""Check of exercises/unpadded_eval.py: evaluate(model, dataset, batch_size) -> accuracy, every sample counted once.

At 2, 3 and 4 ranks, data sets of 1, 10, 11 and 13 samples (fewer samples than ranks included): every rank must
return exactly one process's accuracy. The model records which samples it saw (each sample's first feature is
its index), so a sample counted twice or never is counted, not guessed.
"""
from collections import Counter

import torch
from torch.utils.data import TensorDataset

from common import all_ranks, call, case, fail, load_learner, passed, start, worlds


class RecordingClassifier(torch.nn.Module):
    """A fixed linear classifier of features 1..; feature 0 is the sample's index, which it records."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.seen = []

    def forward(self, x):
        self.seen += x[:, 0].round().long().tolist()
        return self.linear(x[:, 1:])


def main():
    start()
    learner = load_learner("evaluate")
    checked = 0
    for n in worlds(2, 3, 4):
        for size in (1, 10, 11, 13):
            case(f"{n} ranks, a data set of {size} sample{'s' if size > 1 else ''}")
            generator = torch.Generator().manual_seed(size)  # the same data set on every rank
            x = torch.cat([torch.arange(size, dtype=torch.float32)[:, None],
                           torch.randn(size, 4, generator=generator)], dim=1)
            y = torch.randint(0, 3, (size,), generator=generator)
            torch.manual_seed(0)
            model = RecordingClassifier()
            with torch.no_grad():  # one process, the whole data set at once
                expected = (model.linear(x[:, 1:]).argmax(1) == y).sum().item() / size
            model.seen = []
            accuracy = call(learner.evaluate, model, TensorDataset(x, y), 4)
            if isinstance(accuracy, torch.Tensor) and accuracy.numel() == 1:
                accuracy = accuracy.item()
            if not isinstance(accuracy, (float, int)):
                fail(f"evaluate() returned {type(accuracy).__name__}, not a float (the accuracy, from 0 to 1)")
            counts = Counter(i for seen in all_ranks(model.seen) for i in seen)
            twice = sum(c - 1 for c in counts.values() if c > 1)
            never = size - len(counts)
            where = f"with {n} ranks and a data set of {size} sample{'s' if size > 1 else ''}"
            if twice:
                fail(f"{twice} sample(s) counted twice {where}: DistributedSampler pads the data set to a multiple "
                     "of the world size by repeating samples; give each rank its own indices without padding "
                     "(e.g. range(rank, len(dataset), world_size))")
            if never:
                fail(f"{never} sample(s) never evaluated {where}: every sample must be seen by one rank "
                     "(drop_last, or an uneven split?)")
            answers = all_ranks(float(accuracy))
            if any(abs(a - expected) > 1e-6 for a in answers):
                fail(f"wrong accuracy {where}: the ranks returned {[round(a, 4) for a in answers]}, one process "
                     f"gets {expected:.4f}. Sum the correct predictions and the sample counts over the ranks "
                     "(all_reduce), then divide: an average of per-rank accuracies weighs small shards too much")
            checked += 1
    passed(f"{checked} cases: 2, 3 and 4 ranks, 1, 10, 11 and 13 samples; every sample counted once, "
           "every rank returned one process's accuracy")


if __name__ == "__main__":
    main()
