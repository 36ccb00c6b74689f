"""Lesson 12's arithmetic and measurements: what DDP and ZeRO keep per rank, saved activations, and a leak."""
from __future__ import annotations


import torch

# Bytes per parameter, in the ZeRO paper's accounting (Rajbhandari et al., 2020): parameters, gradients,
# optimizer states (K). AdamW in fp32: 4 + 4 + 8 (two moments). Mixed precision: bf16 parameters and
# gradients (2 + 2) and, in the optimizer, an fp32 master copy and two fp32 moments (K = 12).
PRECISIONS = {"fp32 AdamW": (4, 4, 8), "bf16 + fp32 master, AdamW": (2, 2, 12)}
MODELS = {"ResNet-50": 25.6e6, "GPT-2 small": 124e6, "7B model": 7e9}


def per_rank_bytes(num_params: float, world: int, precision: str) -> dict[str, float]:
    """Bytes each rank holds for parameters + gradients + optimizer states, under DDP and ZeRO stages 1-3."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    p, g, k = PRECISIONS[precision]
    psi = num_params
    return {"DDP": (p + g + k) * psi, "ZeRO-1": (p + g) * psi + k * psi / world,
            "ZeRO-2": p * psi + (g + k) * psi / world, "ZeRO-3 / FSDP": (p + g + k) * psi / world}


def plot_per_rank(world: int, precision: str):
    import matplotlib.pyplot as plt

    from .plots import finished

    fig, ax = plt.subplots(figsize=(7, 3.4))
    stages = list(per_rank_bytes(1, world, precision))
    width = 0.8 / len(MODELS)
    for i, (name, n) in enumerate(MODELS.items()):
        values = [v / 2**30 for v in per_rank_bytes(n, world, precision).values()]
        ax.bar([s + i * width for s in range(len(stages))], values, width, label=name)
    ax.set_xticks([s + width for s in range(len(stages))], stages)
    ax.set_yscale("log")
    ax.set_ylabel("GiB per rank")
    ax.axhline(80, color="grey", linestyle="--", linewidth=1)
    ax.text(len(stages) - 0.6, 85, "80 GB GPU", fontsize=8, color="grey")
    ax.set_title(f"{precision}, {world} ranks: parameters + gradients + optimizer states")
    ax.legend(fontsize=8)
    return finished(fig)


def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor, checkpointed: bool) -> dict:
    """Bytes of activations autograd keeps for backward after one forward, each storage counted once (a Tanh's
    output is saved by the Tanh and again as the next Linear's input: one tensor in memory), and how many layer
    forwards run in forward + backward. The weights, saved too, are not counted: they exist anyway.

    With checkpointed=True each child of `model` runs under torch.utils.checkpoint (use_reentrant=False): it keeps
    only its input, and runs its forward again during backward to rebuild what it needs."""
    from torch.utils.checkpoint import checkpoint

    saved, forwards = {}, [0]  # storage address -> bytes: two references to one tensor hold its memory once
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    handles = [m.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
               for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = x
            for block in model.children():
                out = checkpoint(block, out, use_reentrant=False) if checkpointed else block(out)
        forward_bytes = sum(saved.values())
        out.sum().backward()
    finally:
        for h in handles:
            h.remove()
    return {"saved_bytes": forward_bytes, "layer_forwards": forwards[0]}


def graph_saved_bytes(total, model) -> int:
    """Bytes of the tensors that the autograd graph hanging off `total` keeps for a backward: the nodes reachable
    from total.grad_fn, and their saved tensors (the `_saved_*` attributes), weights excluded (they live anyway)."""
    weights = {p.data_ptr() for p in model.parameters()}
    seen, stack, kept = set(), [getattr(total, "grad_fn", None)], {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                value = getattr(node, name)
                if isinstance(value, torch.Tensor) and value.data_ptr() not in weights:
                    kept[(value.data_ptr(), tuple(value.shape))] = value.numel() * value.element_size()
        stack.extend(next_node for next_node, _ in node.next_functions)
    return sum(kept.values())


def evaluation_keeps(steps: int, fix: str) -> int:
    """Bytes that an evaluation loop of `steps` batches keeps alive for a backward that never comes, when it sums
    its loss as `total += loss`, or with a fix: "item" (`total += loss.item()`), "detach" (`total +=
    loss.detach()`), "no_grad" (the loop under torch.no_grad()) or "inference_mode"."""
    import contextlib

    if fix not in ("none", "item", "detach", "no_grad", "inference_mode"):
        raise ValueError(f"unknown fix {fix!r}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(fix, contextlib.nullcontext)
    total = 0.0
    with context():
        for _ in range(steps):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            total = total + (loss.item() if fix == "item" else loss.detach() if fix == "detach" else loss)
    return graph_saved_bytes(total, model)


def plot_fsdp_events(events: list[str]):
    """One FSDP2 step on rank 0, in order: each layer's forward and backward, and the collectives around them."""
    import matplotlib.pyplot as plt

    from .plots import finished

    rows = {"all-gather": 0, "reduce-scatter": 1}
    layers = sorted({int(e.split()[1]) for e in events if e.split()[0] in ("forward", "backward")})
    for layer in layers:
        rows[f"layer {layer}"] = 2 + layer
    fig, ax = plt.subplots(figsize=(8, 2.2 + 0.3 * len(layers)))
    colours = {"all-gather": "tab:blue", "reduce-scatter": "tab:red", "forward": "tab:green", "backward": "tab:orange"}
    for t, event in enumerate(events):
        kind = event.split()[0]
        row = rows[event] if kind in rows else rows[f"layer {event.split()[1]}"]
        ax.barh(row, 0.8, left=t, color=colours[kind])
        if kind in ("forward", "backward"):
            ax.text(t + 0.4, row, kind[0].upper(), ha="center", va="center", fontsize=8, color="white")
    ax.set_yticks(list(rows.values()), list(rows))
    ax.invert_yaxis()
    ax.set_xlabel("order of events in one training step (F = forward, B = backward)")
    return finished(fig)
