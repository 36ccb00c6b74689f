"""Bytes each device moves in one training step: nn.DataParallel against DDP (lesson 01's figure).

A model, not a measurement (a measurement needs several GPUs). What it assumes, from torch's source and NCCL:
* DataParallel's replicate broadcasts the parameters from device 0 (``comm.broadcast_coalesced``), and backward
  sums the replicas' gradients onto device 0 (``comm.reduce_add_coalesced``). With NCCL both run as a pipelined
  chain: every device receives the data once and passes it on once, so the root sends (or receives) it only once.
* forward gathers every replica's outputs on device 0; backward scatters their gradients back (``Gather.backward``).
  A batch on the CPU is scattered from the host straight to each device, so it does not pass through device 0.
* DDP all-reduces the gradients with a ring: each device sends and receives 2(k-1)/k of them. Outputs never move.
"""
from __future__ import annotations


def step_traffic(parameter_bytes: float, output_bytes: float, k: int) -> dict[str, list[dict[str, float]]]:
    """{'DataParallel': [...], 'DDP': [...]}: per device, bytes moved for parameters/gradients and for outputs."""
    if k < 2:
        raise ValueError(f"k must be at least 2 devices, got {k}")
    p, o = parameter_bytes, output_bytes
    dataparallel = []
    for device in range(k):
        # broadcast (forward) and reduce (backward) along the chain 0 -> 1 -> ... -> k-1
        chain = 2 * p if device in (0, k - 1) else 4 * p  # the ends touch the data once per collective
        outputs = 2 * (k - 1) / k * o if device == 0 else 2 * o / k  # gather in, gradients out (and back)
        dataparallel.append({"parameters and gradients": chain, "outputs and their gradients": outputs})
    ddp = [{"parameters and gradients": 4 * (k - 1) / k * p, "outputs and their gradients": 0.0} for _ in range(k)]
    return {"DataParallel": dataparallel, "DDP": ddp}


def plot_step_traffic(cases: dict[str, tuple[float, float]], k: int = 4):
    """One panel per case (name -> (parameter bytes, output bytes)): stacked bars of GB per device."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(5.2 * len(cases), 3.4), squeeze=False)
    colours = {"parameters and gradients": "#6fa8dc", "outputs and their gradients": "#e06666"}
    for ax, (title, (parameter_bytes, output_bytes)) in zip(axes[0], cases.items()):
        traffic = step_traffic(parameter_bytes, output_bytes, k)
        labels, bottoms = [], []
        for wrapper, devices in traffic.items():
            labels += [f"{'DP' if wrapper == 'DataParallel' else 'DDP'}\ndev {d}" for d in range(k)]
        x = range(len(labels))
        bottom = [0.0] * len(labels)
        for part, colour in colours.items():
            heights = [dev[part] / 1e9 for devices in traffic.values() for dev in devices]
            ax.bar(x, heights, bottom=bottom, color=colour, label=part)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("GB in + out per step"), ax.set_title(title, fontsize=10)
        ax.axvline(k - 0.5, color="grey", lw=0.8)
    axes[0][0].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Bytes each of {k} devices moves per training step (a model of the algorithms, not measured)",
                 fontsize=10)
    fig.tight_layout()
    plt.close(fig)
    return fig
