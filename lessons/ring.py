"""Ring all-reduce, step by step, for looking at: a simulation, a stepper widget, a figure.

The schedule is the one in ddp_scripts/ring_allreduce.py: at scatter-reduce step s, rank r
sends chunk (r - s) mod N to rank r+1 and adds the chunk (r - s - 1) mod N it receives;
at all-gather step s it sends chunk (r + 1 - s) mod N and overwrites chunk (r - s) mod N.
Here a chunk's content is the set of ranks whose data it sums, so "partial" and "final"
can be seen (tests/test_ring.py checks that every chunk ends up with all N ranks).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    chunk: int


@dataclass(frozen=True)
class RingStep:
    phase: str  # "start", "scatter-reduce" or "all-gather"
    transfers: tuple[Transfer, ...]
    state: tuple[tuple[frozenset, ...], ...]  # state[rank][chunk] = ranks summed in that chunk


def simulate_ring(n: int) -> list[RingStep]:
    """The 2(N-1) steps of ring all-reduce on N ranks, after the starting state."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the ring needs a whole number of ranks >= 1, got {n!r}")
    state = [[frozenset([rank]) for _ in range(n)] for rank in range(n)]
    steps = [RingStep("start", (), tuple(map(tuple, state)))]
    for phase in ("scatter-reduce", "all-gather"):
        for s in range(n - 1):
            if phase == "scatter-reduce":
                transfers = tuple(Transfer(r, (r + 1) % n, (r - s) % n) for r in range(n))
            else:
                transfers = tuple(Transfer(r, (r + 1) % n, (r + 1 - s) % n) for r in range(n))
            sent = [state[t.src][t.chunk] for t in transfers]  # all sends happen at once
            for t, content in zip(transfers, sent):
                if phase == "scatter-reduce":
                    state[t.dst][t.chunk] = state[t.dst][t.chunk] | content
                else:
                    state[t.dst][t.chunk] = content
            steps.append(RingStep(phase, transfers, tuple(map(tuple, state))))
    return steps


def chunks_sent_per_rank(n: int) -> list[int]:
    return [sum(t.src == r for step in simulate_ring(n) for t in step.transfers) for r in range(n)]


# -- looking at it -----------------------------------------------------------------------

_COLOURS = {"own": "#e8e8e8", "partial": "#ffd97a", "final": "#7ccf8a"}


def _kind(content: frozenset, rank: int, n: int) -> str:
    if len(content) == n:
        return "final"
    return "own" if content == {rank} else "partial"


def step_table_html(n: int, step: int) -> str:
    """One step as an HTML table: a row per rank, a column per chunk, coloured by kind."""
    steps = simulate_ring(n)
    if not 0 <= step < len(steps):
        raise ValueError(f"step must be between 0 and {len(steps) - 1} for N={n}, got {step}")
    current = steps[step]
    moves = ", ".join(f"{t.src}&rarr;{t.dst} (chunk {t.chunk})" for t in current.transfers) or "nothing yet"
    title = f"step {step} of {len(steps) - 1}: {current.phase}"
    rows = []
    for rank in range(n):
        cells = []
        for chunk in range(n):
            content = current.state[rank][chunk]
            label = "+".join(str(r) for r in sorted(content))
            colour = _COLOURS[_kind(content, rank, n)]
            cells.append(f'<td style="background:{colour};padding:4px 8px;text-align:center">{label}</td>')
        rows.append(f"<tr><th style='padding:4px 8px'>rank {rank}</th>{''.join(cells)}</tr>")
    header = "".join(f"<th style='padding:4px 8px'>chunk {c}</th>" for c in range(n))
    legend = " ".join(f'<span style="background:{c};padding:2px 6px">{k}</span>' for k, c in _COLOURS.items())
    return (f'<div class="ring-step"><b>{title}</b><br>sends: {moves}'
            f"<table><tr><th></th>{header}</tr>{''.join(rows)}</table>"
            f"each cell lists the ranks whose data the chunk sums. {legend}</div>")


def ring_stepper(n: int = 4):
    """An ipywidgets stepper: pick N and a step, see every rank's chunks."""
    import ipywidgets as widgets

    ranks = widgets.IntSlider(value=n, min=2, max=8, description="ranks N")
    step = widgets.IntSlider(value=0, min=0, max=2 * (n - 1), description="step")
    view = widgets.HTML(step_table_html(n, 0))

    def redraw(_=None):
        step.max = 2 * (ranks.value - 1)  # clamps step.value too
        view.value = step_table_html(ranks.value, step.value)

    ranks.observe(redraw, names="value")
    step.observe(redraw, names="value")
    return widgets.VBox([widgets.HBox([ranks, step]), view])


def plot_ring_steps(n: int = 4):
    """All steps of the ring for N ranks, one panel each, for readers of the static notebook."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    from .plots import finished

    steps = simulate_ring(n)
    fig, axes = plt.subplots(1, len(steps), figsize=(2.1 * len(steps), 2.6), squeeze=False)
    cmap = ListedColormap([_COLOURS["own"], _COLOURS["partial"], _COLOURS["final"]])
    kinds = {"own": 0, "partial": 1, "final": 2}
    for i, (ax, current) in enumerate(zip(axes[0], steps)):
        grid = [[kinds[_kind(current.state[r][c], r, n)] for c in range(n)] for r in range(n)]
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=2)
        for r in range(n):
            for c in range(n):
                content = current.state[r][c]
                label = "all" if len(content) == n else "+".join(map(str, sorted(content)))
                ax.text(c, r, label, ha="center", va="center", fontsize=7)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if i == 0 else [""] * n, fontsize=7)
        ax.set_title(f"{i}: {current.phase}", fontsize=8)
    fig.suptitle(f"Ring all-reduce on {n} ranks: grey = own data, yellow = partial sum, green = sum of all ranks")
    return finished(fig)
