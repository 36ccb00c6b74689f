"""Check of exercises/tensor_parallel.py: plan(block), given to parallelize_module, makes the gated MLP compute on 2
and 4 ranks what it computes in one process, with one all-reduce per forward.

The block and its weights are the check's (the same on every rank and in the reference); the input is given whole
to every rank. Each world: the forward's output and every parameter's gradient are compared with the single-process
block's, and the forward's collectives are counted (CommDebugMode). A mistake is named from the plan itself: a
style per Linear, in the order the data flows, with the whole input at the start.
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from common import call, case, fail, load_learner, passed, start, worlds


class GatedMLP(torch.nn.Module):
    def __init__(self, width=16, hidden=32):
        super().__init__()
        self.gate = torch.nn.Linear(width, hidden)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


ORDER_HINT = ("gate and up must be ColwiseParallel (each rank computes a slice of the hidden features) and down "
              "RowwiseParallel (it takes those slices and sums the ranks' partial outputs)")


def plan_mistake(plan):
    """What the plan itself says is wrong, or None."""
    if not isinstance(plan, dict):
        return f"plan(block) must return a dict {{name: ParallelStyle}}, not {type(plan).__name__}"
    missing = [name for name in ("gate", "up", "down") if name not in plan]
    if missing:
        return (f"{', '.join(missing)} is not in the plan: a Linear left whole meets the others' slices (its "
                f"output has all the hidden features, theirs 1/N). {ORDER_HINT}")
    kinds = {name: type(plan[name]) for name in ("gate", "up", "down")}
    if kinds != {"gate": ColwiseParallel, "up": ColwiseParallel, "down": RowwiseParallel}:
        wrong = ", ".join(f"{name} is {kind.__name__}" for name, kind in kinds.items())
        return f"the styles are in the wrong order or kind ({wrong}): {ORDER_HINT}"
    for name in ("gate", "up"):
        layouts = getattr(plan[name], "input_layouts", (Replicate(),))
        if any(not isinstance(layout, Replicate) for layout in layouts):
            return (f"{name}'s input_layouts say the input is {layouts[0]}, but every rank is given the whole input:"
                    " leave input_layouts out (Replicate), or each rank computes with the wrong rows as if they were"
                    " the whole batch")
    return None


def main():
    start()
    learner = load_learner("plan")
    for n in worlds(2, 4):
        case(f"{n} ranks")
        mesh = init_device_mesh("cpu", (n,))
        torch.manual_seed(0)
        reference = GatedMLP()
        block = GatedMLP()
        block.load_state_dict(reference.state_dict())
        plan = call(learner.plan, block)
        mistake = plan_mistake(plan)
        x = torch.randn(6, 16, generator=torch.Generator().manual_seed(1))
        try:
            parallelize_module(block, mesh, plan)
            with CommDebugMode() as comms:
                out = block(x)
            out.sum().backward()
        except Exception as error:  # noqa: BLE001  a wrong plan often fails on a shape
            fail(mistake or f"parallelize_module or the forward failed with {n} ranks: {type(error).__name__}: "
                 f"{str(error).splitlines()[0][:200]}")
        full = out.full_tensor() if isinstance(out, DTensor) else out
        expected = reference(x)
        expected.sum().backward()
        if full.shape != expected.shape or not torch.allclose(full, expected, atol=1e-5):
            fail(mistake or f"with {n} ranks the output differs from one process's, with no error: a silent mistake")
        for (name, p), q in zip(block.named_parameters(), reference.parameters()):
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            if not torch.allclose(grad, q.grad, atol=1e-5):
                fail(mistake or f"with {n} ranks the gradient of {name} differs from one process's")
        counts = {str(op).split(".")[-1]: k for op, k in comms.get_comm_counts().items()}
        if counts != {"all_reduce": 1}:
            fail(f"with {n} ranks a forward made {counts or 'no collective'}, not one all-reduce: the hidden layer "
                 "was gathered somewhere; keep it in slices from gate and up to down")
        dist.barrier()
    passed("2 and 4 ranks: the output and every gradient equal one process's, with one all-reduce per forward")


if __name__ == "__main__":
    main()
