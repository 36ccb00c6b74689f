"""Which samples does each rank get? The real DistributedSampler, asked directly.

DistributedSampler needs no process group when it is given num_replicas and rank, so the
notebook can ask it what every rank of a world would see, in one process.
"""
from __future__ import annotations

from torch.utils.data import DistributedSampler

_COLOURS = ["#cfe2f3", "#f4cccc", "#d9ead3", "#fff2cc", "#d9d2e9", "#fce5cd", "#d0e0e3", "#ead1dc"]


def shards(size: int, world_size: int, epoch: int = 0, shuffle: bool = True, drop_last: bool = False,
           set_epoch: bool = True, seed: int = 0) -> list[list[int]]:
    """The indices each rank iterates over in `epoch` (set_epoch=False: as if set_epoch was never called)."""
    for name, value, low in (("size", size, 0), ("world_size", world_size, 1), ("epoch", epoch, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    result = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                     seed=seed, drop_last=drop_last)
        if set_epoch:
            sampler.set_epoch(epoch)
        result.append(list(sampler))
    return result


def shards_html(size, world_size, epoch, shuffle, drop_last) -> str:
    ranks = shards(size, world_size, epoch, shuffle, drop_last)
    seen: dict[int, int] = {}
    for indices in ranks:
        for i in indices:
            seen[i] = seen.get(i, 0) + 1
    rows = []
    for rank, indices in enumerate(ranks):
        cells = "".join(
            f'<td style="background:{_COLOURS[rank % len(_COLOURS)]};padding:2px 6px;'
            f'{"font-weight:bold;text-decoration:underline" if seen[i] > 1 else ""}">{i}</td>' for i in indices)
        rows.append(f"<tr><th style='padding:2px 6px'>rank {rank}</th>{cells}</tr>")
    total = sum(len(r) for r in ranks)
    repeated = sorted(i for i, n in seen.items() if n > 1)
    dropped = sorted(set(range(size)) - set(seen))
    summary = (f"{size} samples, {world_size} ranks: {len(ranks[0])} per rank, {total} in all. "
               f"Repeated (padding, underlined): {repeated or 'none'}. Never seen (drop_last): {dropped or 'none'}.")
    return f'<div class="sampler-shards"><table>{"".join(rows)}</table>{summary}</div>'


def sampler_explorer(size: int = 10, world_size: int = 4):
    """An ipywidgets explorer: dataset size, world size, epoch, shuffle, drop_last -> each rank's indices."""
    import ipywidgets as widgets

    controls = {
        "size": widgets.IntSlider(value=size, min=1, max=40, description="dataset size"),
        "world_size": widgets.IntSlider(value=world_size, min=1, max=8, description="world size"),
        "epoch": widgets.IntSlider(value=0, min=0, max=5, description="epoch"),
        "shuffle": widgets.Checkbox(value=True, description="shuffle"),
        "drop_last": widgets.Checkbox(value=False, description="drop_last"),
    }
    view = widgets.HTML(shards_html(**{k: c.value for k, c in controls.items()}))

    def redraw(_=None):
        view.value = shards_html(**{k: c.value for k, c in controls.items()})

    for control in controls.values():
        control.observe(redraw, names="value")
    return widgets.VBox([widgets.HBox(list(controls.values())[:3]), widgets.HBox(list(controls.values())[3:]), view])


def shards_figure(size: int = 10, world_size: int = 4, epochs: tuple[int, ...] = (0, 1)):
    """The explorer's picture without a kernel: each rank's indices for a few settings, padding hatched.

    One panel per setting: in order (padding repeats the first samples), drop_last (the tail never seen),
    and shuffled in each of `epochs` (with set_epoch)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    settings = [("in order: padding repeats samples", dict(shuffle=False)),
                ("drop_last=True", dict(shuffle=False, drop_last=True))]
    settings += [(f"shuffled, set_epoch({e})", dict(epoch=e)) for e in epochs]
    per_rank = len(shards(size, world_size, shuffle=False)[0])
    fig, axes = plt.subplots(1, len(settings), figsize=(len(settings) * (0.9 + 0.45 * per_rank), 0.4 * world_size + 1),
                             squeeze=False)
    for ax, (title, options) in zip(axes[0], settings):
        ranks = shards(size, world_size, **options)
        counts = {}
        for indices in ranks:
            for i in indices:
                counts[i] = counts.get(i, 0) + 1
        for rank, indices in enumerate(ranks):
            for column, i in enumerate(indices):
                ax.add_patch(Rectangle((column, rank), 1, 1, facecolor=_COLOURS[rank % len(_COLOURS)],
                                       edgecolor="white", hatch="///" if counts[i] > 1 else None))
                ax.text(column + 0.5, rank + 0.5, str(i), ha="center", va="center", fontsize=9,
                        fontweight="bold" if counts[i] > 1 else "normal")
        unseen = sorted(set(range(size)) - set(counts))
        ax.set_title(title + (f"\nnever seen: {unseen}" if unseen else ""), fontsize=9)
        ax.set_xlim(0, per_rank), ax.set_ylim(world_size, 0)
        ax.set_yticks([r + 0.5 for r in range(world_size)], [f"rank {r}" for r in range(world_size)], fontsize=8)
        ax.set_xticks([]), ax.set_frame_on(False)
    fig.suptitle(f"{size} samples over {world_size} ranks (hatched: served twice)", fontsize=10)
    fig.tight_layout()
    plt.close(fig)
    return fig
