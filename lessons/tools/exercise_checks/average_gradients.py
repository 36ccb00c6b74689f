"""Check of exercises/average_gradients.py: average_gradients(model), called after backward(), leaves every rank
with the average gradient, as torch's DDP does.

At 3 ranks, 3 SGD steps, each rank on its own data; the model has a tied weight (one Parameter used twice), a
frozen layer (requires_grad=False) and plain layers. Each step, every gradient is compared with DDP's, and with
what the classic mistakes would give (the rank's own gradient, N x the average, the average / N).
"""
import copy

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import call, case, fail, load_learner, passed, start, worlds

STEPS = 3


class TiedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Linear(6, 6)
        self.decode = torch.nn.Linear(6, 6)
        self.decode.weight = self.encode.weight  # tied: one Parameter, used twice in forward
        self.frozen = torch.nn.Linear(6, 6).requires_grad_(False)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.frozen(torch.tanh(self.decode(torch.tanh(self.encode(x))))))


def close(a, b):
    return torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def none_hint(error):
    if "NoneType" in str(error) or "None" in str(error):
        return "a parameter with requires_grad=False has no .grad: skip parameters whose grad is None"
    return None


def main():
    start()
    learner = load_learner("average_gradients")
    for n in worlds(3):
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = TiedModel()
        reference = DDP(copy.deepcopy(model))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        for step in range(STEPS):
            case(f"{n} ranks, step {step + 1} of {STEPS}")
            generator = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
            x, y = torch.randn(5, 6, generator=generator), torch.randint(0, 3, (5,), generator=generator)
            for m, opt in ((model, optimizer), (reference, reference_optimizer)):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(x), y).backward()
            params = dict(model.named_parameters())
            own = {name: params[name].grad.clone() for name in names}
            call(learner.average_gradients, model, hint_for=none_hint)
            expected = dict(reference.module.named_parameters())
            if model.frozen.weight.grad is not None and model.frozen.weight.grad.abs().sum() > 0:
                fail("the frozen layer (requires_grad=False) got a gradient: leave parameters without a grad alone")
            kinds = {}
            for name in names:
                got, average = params[name].grad, expected[name].grad
                if got is None:
                    kinds[name] = "none"
                elif close(got, average):
                    kinds[name] = "average"
                elif close(got, n * average):
                    kinds[name] = "sum"
                elif close(got, average / n):
                    kinds[name] = "twice"
                elif close(got, own[name]):
                    kinds[name] = "own"
                else:
                    kinds[name] = "other"
            wrong = {name: kind for name, kind in kinds.items() if kind != "average"}
            if wrong:
                where = f"with {n} ranks at step {step + 1}"
                values = set(wrong.values())
                if values == {"sum"} and len(wrong) == len(names):
                    fail(f"gradients are {n}x too large {where}: all_reduce sums; divide by the world size")
                if values == {"twice"} and len(wrong) == len(names):
                    fail(f"gradients are {n}x too small {where}: divided twice (ReduceOp.AVG already averages: no / N after it)")
                if values == {"own"} and len(wrong) == len(names):
                    fail(f"no gradient was averaged {where}: each rank still has its own; all_reduce each .grad "
                         "and divide by the world size")
                if values <= {"own", "none"}:
                    fail(f"only some parameters were averaged {where}: {', '.join(sorted(wrong))} kept this rank's "
                         "own gradient; average every parameter that has a .grad (model.parameters())")
                fail(f"gradients differ from DDP's {where}: " + ", ".join(f"{name} ({kind_words[kind]})"
                                                                           for name, kind in sorted(wrong.items())))
            optimizer.step()
            reference_optimizer.step()
        for name, p in reference.module.named_parameters():
            if not close(dict(model.named_parameters())[name], p):
                fail(f"after {STEPS} steps, parameter {name} differs from DDP's")
    passed(f"3 ranks, {STEPS} SGD steps: every gradient equals DDP's (tied weight, frozen layer, plain layers)")


kind_words = {"none": "no grad", "sum": "N x the average", "twice": "the average / N", "own": "this rank's own",
              "other": "neither the average nor a known mistake"}


if __name__ == "__main__":
    main()
