"""Figures for the lessons, drawn from what the launched scripts reported (their RESULT)."""
from __future__ import annotations

# Who sends to whom, for each collective on N ranks (src, dst) — the picture's arrows.
_FLOWS = {
    "send_recv": lambda n: [(0, 1)],
    "broadcast": lambda n: [(0, d) for d in range(n) if d != 0],
    "reduce": lambda n: [(s, 0) for s in range(n) if s != 0],
    "all_reduce": lambda n: [(s, d) for s in range(n) for d in range(n) if s != d],
    "all_gather": lambda n: [(s, d) for s in range(n) for d in range(n) if s != d],
    "reduce_scatter": lambda n: [(s, d) for s in range(n) for d in range(n) if s != d],
    "barrier": lambda n: [],
}


def finished(fig):
    """Lay a figure out and close it: a cell shows it once, as its value, and the inline
    backend does not show it a second time (nbval would see two figures)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    plt.close(fig)
    return fig


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def plot_collective(result: dict):
    """Before (top) and after (bottom) on each rank, with an arrow for each rank-to-rank flow."""
    import matplotlib.pyplot as plt

    op, n = result["op"], result["world_size"]
    fig, ax = plt.subplots(figsize=(2.2 * n + 1, 2.6))
    for rank in range(n):
        for y, key in ((1.0, "before"), (0.0, "after")):
            ax.text(rank, y, f"rank {rank}\n{_fmt(result[key][rank])}", ha="center", va="center", fontsize=8,
                    bbox={"boxstyle": "round", "facecolor": "#dde8f7" if key == "before" else "#d9f2dc"})
    for src, dst in _FLOWS[op](n):
        ax.annotate("", xy=(dst, 0.2), xytext=(src, 0.8),
                    arrowprops={"arrowstyle": "->", "color": "#555", "alpha": 0.6})
    if op == "barrier":
        ax.axhline(0.5, color="#c33", linestyle="--")
        ax.text(n - 0.5, 0.55, "everyone waits here", color="#c33", fontsize=8, ha="right")
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_ylim(-0.4, 1.4)
    ax.axis("off")
    ax.set_title(f"{op}: before (top), after (bottom)")
    return finished(fig)


def plot_traffic(results: list[dict]):
    """Bytes each rank sends, ring vs naive, against N, measured (dots) and predicted (lines)."""
    import matplotlib.pyplot as plt

    ns = [r["world_size"] for r in results]
    size = results[0]["numel"] * 4  # float32
    ring = [max(r["bytes_per_rank"]["ring"]["sent"]) / size for r in results]
    naive0 = [r["bytes_per_rank"]["naive"]["sent"][0] / size for r in results]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(ns, [2 * (n - 1) / n for n in ns], "-", color="tab:green", label="ring, 2(N-1)/N")
    ax.plot(ns, ring, "o", color="tab:green", label="ring, measured (busiest rank)")
    ax.plot(ns, [n - 1 for n in ns], "-", color="tab:red", label="naive rank 0, N-1")
    ax.plot(ns, naive0, "o", color="tab:red", label="naive rank 0, measured")
    ax.set_xlabel("ranks N")
    ax.set_ylabel("bytes sent per rank / tensor size S")
    ax.legend()
    ax.grid(alpha=0.3)
    return finished(fig)


def fit_alpha_beta(rows: list[dict], impl: str) -> tuple[float, float]:
    """Fit time = alpha + beta * bytes: latency (s) and inverse bandwidth (s/byte).

    On *relative* error: each point weighs 1/time^2. A plain least-squares fit on seconds is decided by
    the largest messages (a 16 MB time is a thousand 4 KB times), and its alpha means nothing."""
    points = [(r["bytes"], r["seconds"]) for r in rows if r["impl"] == impl]
    if len(points) < 2:
        raise ValueError(f"need at least two sizes for {impl!r}, got {len(points)}")
    # Minimise sum(((alpha + beta*x - y) / y)^2): weighted normal equations, weights w = 1/y^2.
    w = [1 / y ** 2 for _, y in points]
    sw, swx, swy = sum(w), sum(wi * x for wi, (x, _) in zip(w, points)), sum(wi * y for wi, (_, y) in zip(w, points))
    swxx = sum(wi * x * x for wi, (x, _) in zip(w, points))
    swxy = sum(wi * x * y for wi, (x, y) in zip(w, points))
    beta = (sw * swxy - swx * swy) / (sw * swxx - swx ** 2)
    return (swy - beta * swx) / sw, beta


def plot_bandwidth(result: dict):
    """busbw against message size for each implementation, with the alpha-beta model's curve."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    n = result["world_size"]
    for impl, colour in (("builtin", "tab:blue"), ("ring", "tab:orange")):
        rows = [r for r in result["rows"] if r["impl"] == impl]
        sizes = [r["bytes"] for r in rows]
        ax.plot(sizes, [r["busbw_gbps"] for r in rows], "o", color=colour, label=f"{impl}, measured")
        alpha, beta = fit_alpha_beta(result["rows"], impl)
        model = [s / (alpha + beta * s) / 1e9 * 2 * (n - 1) / n for s in sizes]
        ax.plot(sizes, model, "-", color=colour, alpha=0.6, label=f"{impl}, alpha-beta model")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"all-reduce on {n} ranks ({result['backend']})")
    ax.legend()
    ax.grid(alpha=0.3)
    return finished(fig)


def plot_bucket_sweep(result: dict):
    """Step time against bucket size, ours vs torch's DDP; naive and overlap as flat lines."""
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for variant, colour in (("bucketed", "tab:orange"), ("torch_ddp", "tab:blue")):
        points = sorted((r["bucket_mb"], r["step_ms"]) for r in rows if r["variant"] == variant)
        ax.plot(*zip(*points), "o-", color=colour, label=variant)
    for variant, style in (("naive", ":"), ("overlap", "--")):
        for r in rows:
            if r["variant"] == variant:
                ax.axhline(r["step_ms"], color="grey", linestyle=style, label=variant)
    ax.set_xscale("log")
    ax.set_xlabel("bucket size (MB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"DDP step time on {result['world_size']} ranks")
    ax.legend()
    ax.grid(alpha=0.3)
    return finished(fig)


def plot_overlap(*results: dict):
    """When each all-reduce started, against the backward() it belongs to (ms from backward's start), one row
    per variant: the overlap variant's all-reduces start while backward is still running."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(results)))
    for row, result in enumerate(results):
        ax.barh(row, result["backward_ms"], color="tab:blue", alpha=0.3, label="backward()" if row == 0 else None)
        ax.plot(result["allreduce_launch_ms"], [row] * len(result["allreduce_launch_ms"]), "|", color="tab:red",
                markersize=18, markeredgewidth=2, label="an all-reduce starts" if row == 0 else None)
    ax.set_yticks(range(len(results)), [r["variant"] for r in results])
    ax.set_xlabel("ms from the start of backward() (last step, rank 0)")
    ax.legend(loc="lower right", fontsize=8)
    return finished(fig)


def ddp_picture(world_size: int = 2, save: str | None = None):
    """DDP in one picture: one process per device, each with a full replica and its own shard of the batch;
    backward() all-reduces (averages) the gradients, so every optimizer step gives identical weights.
    ``save``: also write the figure to this path (PNG, no timestamp, so the same picture is the same file)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.2 * world_size + 1.6, 4.6))
    rows = [  # (y, text, colour) for each rank, top to bottom
        (5.0, "process rank {r}\n(one per device: cuda:{r}, or a CPU process)", "#eeeeee"),
        (4.0, "data shard {r}: batch B/{n}\n(DistributedSampler)", "#fde9c8"),
        (3.0, "model replica (rank 0's weights, copied at wrap)\nforward + loss on its shard", "#dde8f7"),
        (2.0, "backward: local gradients", "#dde8f7"),
        (0.5, "optimizer.step()\nweights identical on every rank", "#d9f2dc"),
    ]
    for r in range(world_size):
        for y, text, colour in rows:
            ax.text(r, y, text.format(r=r, n=world_size), ha="center", va="center", fontsize=8.5,
                    bbox={"boxstyle": "round", "facecolor": colour, "edgecolor": "#888"})
        for top, bottom in ((5.0, 4.0), (4.0, 3.0), (3.0, 2.0)):
            ax.annotate("", xy=(r, bottom + 0.32), xytext=(r, top - 0.32), arrowprops={"arrowstyle": "->", "color": "#555"})
        ax.annotate("", xy=(r, 1.5), xytext=(r, 2.0 - 0.2), arrowprops={"arrowstyle": "->", "color": "#555"})
        ax.annotate("", xy=(r, 0.5 + 0.38), xytext=(r, 1.05), arrowprops={"arrowstyle": "->", "color": "#555"})
    # The all-reduce: a band across every rank, during backward, bucket by bucket.
    ax.add_patch(plt.Rectangle((-0.45, 1.05), world_size - 0.1, 0.45, facecolor="#f6d5d5", edgecolor="#c33"))
    ax.text((world_size - 1) / 2, 1.27, "all-reduce: every rank gets the average of all ranks' gradients\n"
            "(during backward, overlapped with it)", ha="center", va="center", fontsize=8.5, color="#900")
    ax.set_xlim(-0.75, world_size - 0.25)
    ax.set_ylim(0.0, 5.6)
    ax.axis("off")
    ax.set_title(f"DistributedDataParallel on {world_size} devices: same start, same gradients, same weights",
                 fontsize=10)
    fig = finished(fig)
    if save:
        fig.savefig(save, dpi=110, metadata={"Software": None})
    return fig


# Lesson 09 and lesson 12's figures (appended together; the other lessons' are above).


def plot_accumulation_timeline(timelines: dict[str, list[str]]):
    """One optimizer step per row, as grad_accumulation.py recorded it on rank 0 ("first_step_timeline"): each
    micro-batch's forward (F) and backward (B), and each all-reduce that DDP's comm hook was called for (AR),
    placed after the backward it ran in. Micro-batch j takes the same column in every row, so the rows compare."""
    import matplotlib.pyplot as plt

    colours = {"forward": "tab:green", "backward": "tab:orange", "all-reduce": "tab:red"}
    k = 1 + max(int(e.split()[1]) for events in timelines.values() for e in events if e != "all-reduce")
    fig, ax = plt.subplots(figsize=(8, 1.1 + 0.45 * len(timelines)))
    for row, (label, events) in enumerate(timelines.items()):
        micro_batch, reduces = 0, {}
        for event in events:
            kind = event.split()[0]
            if kind == "all-reduce":
                reduces[micro_batch] = reduces.get(micro_batch, 0) + 1
                continue
            micro_batch = int(event.split()[1])
            left = 3 * micro_batch + (0 if kind == "forward" else 1)
            ax.barh(row, 0.95, left=left, height=0.6, color=colours[kind])
            ax.text(left + 0.475, row, f"{kind[0].upper()}{micro_batch}", ha="center", va="center", fontsize=7,
                    color="white")
        for j, n in reduces.items():  # several buckets: several all-reduces share the column
            for i in range(n):
                ax.barh(row, 0.9 / n, left=3 * j + 2 + i / n, height=0.6, color=colours["all-reduce"])
            ax.text(3 * j + 2.45, row, "AR" if n == 1 else f"{n} AR", ha="center", va="center", fontsize=7,
                    color="white")
        total = sum(reduces.values())
        ax.text(3 * k + 0.2, row, f"{total} all-reduce{'' if total == 1 else 's'}", va="center", fontsize=8)
    ax.set_yticks(range(len(timelines)), list(timelines))
    ax.invert_yaxis()
    ax.set_xticks([3 * j + 1.5 for j in range(k)], [f"micro-batch {j}" for j in range(k)])
    ax.set_xlim(-0.2, 3 * k + 2.2)
    ax.set_title("One optimizer step on rank 0: F forward, B backward, AR an all-reduce DDP ran (its comm hook's "
                 "calls)", fontsize=9)
    return finished(fig)


def plot_sharded_state(stages: dict[str, dict[str, float]], unit: float = 2**30, unit_name: str = "GiB",
                       title: str = ""):
    """What one rank holds under each stage, stacked: parameters, gradients, optimizer states (``stages``: stage
    -> part -> bytes). A part smaller than the first stage's (DDP's) is drawn hatched: that stage shards it."""
    import matplotlib.pyplot as plt

    colours = {"parameters": "tab:blue", "gradients": "tab:orange", "optimizer states": "tab:green"}
    first = next(iter(stages.values()))
    number = (lambda v: f"{v:,.0f}") if unit == 1 else (lambda v: f"{v:.3g}")  # bytes whole, GiB to 3 digits
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for x, (stage, parts) in enumerate(stages.items()):
        bottom = 0.0
        for part, value in parts.items():
            sharded = value < first[part]
            ax.bar(x, value / unit, 0.6, bottom=bottom, color=colours[part], hatch="//" if sharded else None,
                   edgecolor="white", label=part if x == 0 else None)
            if value / unit > 0.04 * max(sum(p.values()) for p in stages.values()) / unit:
                ax.text(x, bottom + value / unit / 2, number(value / unit), ha="center", va="center", fontsize=7.5,
                        color="white")
            bottom += value / unit
        ax.text(x, bottom, number(bottom), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(stages)), list(stages))
    ax.set_ylim(0, 1.3 * max(sum(p.values()) for p in stages.values()) / unit)  # room for the legend above the bars
    ax.set_ylabel(f"{unit_name} per rank")
    ax.set_title(title + "\nhatched: sharded over the ranks (this rank holds its share only)", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    return finished(fig)


# Lesson 10b's figure.


def plot_rank_grid(ranks: list[dict]):
    """Lesson 10b: which global rank each (node, local rank) got, from what each rank printed.
    ``ranks``: one dict per rank with its ``node``, ``local_rank``, ``rank`` and ``world_size``."""
    import matplotlib.pyplot as plt

    nodes = 1 + max(r["node"] for r in ranks)
    per_node = 1 + max(r["local_rank"] for r in ranks)
    fig, ax = plt.subplots(figsize=(1.6 * per_node + 1.6, 0.9 * nodes + 1.0), dpi=80)
    for r in ranks:
        x, y = r["local_rank"], nodes - 1 - r["node"]  # node 0 on top
        ax.add_patch(plt.Rectangle((x - 0.45, y - 0.4), 0.9, 0.8, facecolor=f"C{r['node']}", alpha=0.25))
        ax.text(x, y + 0.1, f"RANK {r['rank']}", ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x, y - 0.2, f"= {r['node']}×{per_node}+{r['local_rank']}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(per_node), [f"LOCAL_RANK {i}" for i in range(per_node)], fontsize=8)
    ax.set_yticks(range(nodes), [f"node {nodes - 1 - i}\n(GROUP_RANK)" for i in range(nodes)], fontsize=8)
    ax.set_xlim(-0.55, per_node - 0.45)
    ax.set_ylim(-0.55, nodes - 0.45)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"RANK = GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK (world of {ranks[0]['world_size']})",
                 fontsize=9)
    return finished(fig)


# Lesson 11's figure.


def plot_flight_recorder(records: dict[int, list[tuple[str, str]]], spans: list[tuple[int, int, str]] = ()):
    """Each rank's collectives as the Flight Recorder listed them: one lane per rank, entries in order (a box
    each: number, collective, input sizes). Entries the same on every rank are grey and joined across the lanes;
    the first entry that differs is red, and a rank with no entry there gets a dashed empty box.
    ``records``: {rank: [(collective, sizes), ...]}; ``spans``: (first, last, label) to name runs of entries,
    numbered from 1 as the recorder numbers them."""
    import matplotlib.pyplot as plt

    ranks = sorted(records)
    lanes = [records[r] for r in ranks]
    same = 0
    while same < min(map(len, lanes)) and all(lane[same] == lanes[0][same] for lane in lanes):
        same += 1
    length = max(map(len, lanes))
    columns = max(length, same + 1)  # room for the dashed box when one rank stopped before the others
    fig, ax = plt.subplots(figsize=(0.95 * columns + 1.2, 0.9 * len(ranks) + 1.2))
    for row, (rank, lane) in enumerate(zip(ranks, lanes)):
        y = -row
        ax.text(-0.65, y, f"rank {rank}", ha="right", va="center", fontsize=9, fontweight="bold")
        for i in range(columns):
            if i < len(lane):
                name, sizes = lane[i]
                diverging = i >= same
                ax.text(i, y, f"#{i + 1}\n{name.removeprefix('gloo:').removeprefix('nccl:')}\n{sizes}",
                        ha="center", va="center", fontsize=7.5, color="#900" if diverging else "#222",
                        bbox={"boxstyle": "round", "facecolor": "#f6d5d5" if diverging else "#eeeeee",
                              "edgecolor": "#c33" if diverging else "#888", "linewidth": 1.6 if diverging else 0.8})
            elif i == same:
                ax.text(i, y, f"#{i + 1}\nnone", ha="center", va="center", fontsize=7.5, color="#900",
                        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#c33", "linestyle": "--"})
    for i in range(same):  # the entries every rank issued: a partner on each lane
        ax.plot([i, i], [-0.32, -(len(ranks) - 1) + 0.32], color="#888", linewidth=0.8, zorder=0)
    for first, last, label in spans:
        ax.annotate("", xy=(last - 1 + 0.4, 0.62), xytext=(first - 1 - 0.4, 0.62),
                    arrowprops={"arrowstyle": "-", "color": "#555"})
        ax.text((first + last) / 2 - 1, 0.7, label, ha="center", va="bottom", fontsize=7.5, color="#333")
    ax.set_xlim(-1.6, columns - 0.45)
    ax.set_ylim(-(len(ranks) - 1) - 0.55, 1.05)
    ax.axis("off")
    ax.set_title(f"Flight Recorder: the first {same} collectives match on every rank; from #{same + 1} on, they part",
                 fontsize=10)
    return finished(fig)


def plot_pipeline_timeline(*results: dict):
    """One panel per run of pipeline_parallel.py: a row per stage (rank), each forward (F) and backward (B) of a
    micro-batch at the unit it can start when each takes one unit ("logical_timeline"); the gaps are the bubble."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 0.4 + 0.55 * sum(r["world_size"] for r in results)),
                             squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        for stage, ops in enumerate(result["logical_timeline"]):
            for op, start in ops:
                ax.barh(stage, 0.95, left=start, height=0.7, color="tab:green" if op[0] == "F" else "tab:orange")
                ax.text(start + 0.475, stage, op, ha="center", va="center", fontsize=7, color="white")
        ax.set_yticks(range(result["world_size"]), [f"rank {r}" for r in range(result["world_size"])])
        ax.invert_yaxis()
        ax.set_xlim(-0.2, result["total_units"] + 0.2)
        ax.set_xticks(range(result["total_units"] + 1))
        ax.set_title(f"{result['schedule']}, {result['world_size']} stages, {result['microbatches']} micro-batch"
                     f"{'es' if result['microbatches'] > 1 else ''}: bubble {result['bubble_fraction']:.0%}, at most "
                     f"{max(result['peak_activations_per_stage'])} micro-batches' activations held", fontsize=9)
    axes[-1, 0].set_xlabel("time, in units of one forward (F) or one backward (B) of a micro-batch on one stage")
    return finished(fig)


def _kind_of(name: str) -> str | None:
    """What a training thread's top-level op is part of, for the timeline's colors."""
    if name.startswith("enumerate(DataLoader)"):
        return "loader"
    if name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
        return "optimizer"
    if name.startswith("autograd::") or "Backward" in name or name.startswith("torch.distributed.ddp.reducer"):
        return "backward"
    return "forward"


def plot_rank_timelines(traces: dict[str, list], step: int | None = None):
    """One panel per case, two rows per rank: its training thread (loader, forward, backward, optimizer) and its
    communication (gloo's threads, or NCCL's kernels), over one profiled step (the middle one by default) of one
    Chrome trace per rank. On one machine the ranks share a clock, so a rank's wait shows as a gap."""
    import json
    from pathlib import Path

    import matplotlib.pyplot as plt

    from .tools.doctor_profile import is_communication

    colors = {"loader": "tab:purple", "forward": "tab:green", "backward": "tab:orange", "optimizer": "tab:gray",
              "communication": "tab:red"}
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 0.6 + 1.0 * sum(len(p) for p in traces.values())),
                             squeeze=False)
    for ax, (case, paths) in zip(axes[:, 0], traces.items()):
        spans = {}
        for rank, path in enumerate(paths):
            events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
            marks = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
            mark = marks[len(marks) // 2] if step is None else next(m for m in marks if m["name"].endswith(f"#{step}"))
            spans[rank] = (mark, events)
        origin = min(mark["ts"] for mark, _ in spans.values())
        for rank, (mark, events) in spans.items():
            start, end, row = mark["ts"], mark["ts"] + mark["dur"], 2 * rank
            top_end = start
            for e in sorted((e for e in events if e["tid"] == mark["tid"] and e is not mark
                             and start <= e["ts"] < end), key=lambda e: (e["ts"], -e["dur"])):
                if e["ts"] >= top_end:  # top-level only: its children are inside it
                    ax.barh(row, e["dur"] / 1e3, left=(e["ts"] - origin) / 1e3, height=0.7,
                            color=colors[_kind_of(e["name"])])
                    top_end = e["ts"] + e["dur"]
            for e in events:
                if is_communication(e) and e["ts"] < end and e["ts"] + e["dur"] > start:
                    ax.barh(row + 1, e["dur"] / 1e3, left=(e["ts"] - origin) / 1e3, height=0.7,
                            color=colors["communication"], alpha=0.6)
            ax.plot([(end - origin) / 1e3] * 2, [row - 0.45, row + 1.45], color="black", linewidth=0.8)
        ax.set_yticks(range(2 * len(spans)), [label for r in spans for label in (f"rank {r}", "  its comm")])
        ax.invert_yaxis()
        ax.set_title(case, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from the step's start (a black line: where each rank's step ends)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    axes[0, 0].legend(handles, list(colors), ncol=5, fontsize=7, loc="lower right", bbox_to_anchor=(1, 1.02))
    return finished(fig)
