"""The orders of a pipeline's stages, read before anything runs: each stage's list of ("F", m) and ("B", m).

A forward of micro-batch m on stage s waits for stage s-1's forward of m (it receives its output); a backward waits
for stage s+1's backward of m (its gradient); sends never wait (isend). Pure Python, no torch: the exercise check
names a mistake from the orders alone, in a fraction of a second, before it launches ranks to run a right one.
Its length too: with a forward and a backward taking one step each, 1F1B runs M micro-batches on N stages in
2(M + N - 1) steps, idle a fraction (N - 1)/(M + N - 1) of them (the bubble); an order that takes longer is named,
with its own bubble.

CASES are the (stages, micro-batches) it reads, the first that fails named: 2, 3, 4, 5 and 8 stages (3 and 5: an order
right only at a power of two), and fewer micro-batches than stages (2 on 3 and 4 stages, 4 on 5 and 8: a warm-up
num_stages - 1 - stage not capped by the micro-batches there are). 2 stages and 4 micro-batches come first: the
smallest case names most mistakes.
"""

CASES = ((2, 4), (3, 4), (4, 4), (5, 4), (4, 8), (3, 2), (4, 2), (8, 4))


def order_mistake(orders: list, microbatches: int) -> str | None:
    """What is wrong with these orders (one per stage, stage 0 first), or None: the list's shape, a micro-batch lost
    or run twice, a backward before its forward, a deadlock, or more activations held than 1F1B holds."""
    stages = len(orders)
    where = f"with {stages} stages and {microbatches} micro-batches"
    for s, order in enumerate(orders):
        if not isinstance(order, list) or not all(
                isinstance(op, tuple) and len(op) == 2 and op[0] in ("F", "B") and isinstance(op[1], int)
                for op in order):
            return (f"one_f_one_b({s}, {stages}, {microbatches}) must return a list of ('F', m) and ('B', m) "
                    f"tuples, not {order!r:.80}")
        if warmup(order) > microbatches:  # before the micro-batch count: what is wrong is the warm-up's length
            return (f"stage {s} runs {warmup(order)} forwards before its first backward {where}, and there are only "
                    f"{microbatches} micro-batches (it runs the forward of micro-batch {microbatches}, which does not "
                    "exist): cap the warm-up at the micro-batches there are, min(microbatches, num_stages - 1 - stage)"
                    " forwards")
        for kind, name in (("F", "forward"), ("B", "backward")):
            runs = [m for k, m in order if k == kind]
            lost = sorted(set(range(microbatches)) - set(runs))
            twice = sorted({m for m in runs if runs.count(m) > 1})
            stray = sorted(set(runs) - set(range(microbatches)))
            if lost:
                return (f"stage {s} never runs the {name} of micro-batch {lost[0]} {where} ({len(lost)} lost): every "
                        f"micro-batch needs one forward and one backward on every stage, or its gradient is lost")
            if twice or stray:
                m = (twice or stray)[0]
                return (f"stage {s} runs the {name} of micro-batch {m} {'twice' if twice else '(no such micro-batch)'}"
                        f" {where}: micro-batches are numbered 0 to {microbatches - 1}, each run once")
        ran = set()
        for kind, m in order:
            if kind == "F":
                ran.add(m)
            elif m not in ran:
                return (f"stage {s} runs the backward of micro-batch {m} before its forward {where}: a backward needs "
                        "the activations its forward kept")
    done, position = set(), [0] * stages
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                kind, m = orders[s][position[s]]
                needs = (s - 1, "F", m) if kind == "F" else (s + 1, "B", m)
                if 0 <= needs[0] < stages and needs not in done:
                    break
                done.add((s, kind, m))
                position[s], moved = position[s] + 1, True
    stuck = [s for s in range(stages) if position[s] < len(orders[s])]
    if stuck:
        waits = []
        for s in stuck[:3]:
            kind, m = orders[s][position[s]]
            other = s - 1 if kind == "F" else s + 1
            waits.append(f"stage {s} waits to run {kind}{m} for stage {other}'s {kind}{m}")
        off = [t for t in range(stages) if warmup(orders[t]) != min(microbatches, stages - t)]
        how = ("warm up with num_stages - 1 - stage forwards" if not off else
               f"stage {off[0]} runs {warmup(orders[off[0]])} forward(s) before its first backward, where 1F1B runs "
               f"{min(microbatches, stages - off[0])}: a warm-up of min(microbatches, num_stages - 1 - stage) = "
               f"{min(microbatches, stages - 1 - off[0])}, then one forward and one backward")
        return (f"the stages deadlock {where}: {'; '.join(waits)}, and each of those waits too. A stage must send "
                f"the next stage every forward it needs before it waits for a gradient: {how}")
    for s, order in enumerate(orders):
        held, peak = set(), 0
        for kind, m in order:
            if kind == "F":
                held.add(m)
            else:
                held.discard(m)
            peak = max(peak, len(held))
        limit = min(microbatches, stages - s)
        if peak > limit:
            return (f"stage {s} holds {peak} micro-batches' activations at its peak {where}; 1F1B holds at most "
                    f"min(microbatches, num_stages - stage) = {limit}: run each backward as soon as you can (all "
                    "forwards first is GPipe, whose memory grows with the micro-batches)")
    steps, best = schedule_length(orders), 2 * (microbatches + stages - 1)
    if steps > best:
        warmups = [warmup(order) for order in orders]
        short = [s for s in range(stages) if warmups[s] < min(microbatches, stages - s)]
        why = ("no warm-up: the stages never overlap, each micro-batch goes through every stage and back before the"
               " next starts" if all(w == 1 for w in warmups) else
               f"stage {short[0]} runs {warmups[short[0]]} forward(s) before its first backward, 1F1B"
               f" {min(microbatches, stages - short[0])}" if short else "a stage waits where 1F1B's does not")
        return (f"the stages take {steps} steps {where} where 1F1B takes {best} (a forward and a backward one step"
                f" each): the pipeline is idle {1 - 2 * microbatches / steps:.2f} of the time, 1F1B's bubble"
                f" (N - 1)/(M + N - 1) = {(stages - 1) / (microbatches + stages - 1):.2f}: {why}. Warm up with"
                " num_stages - 1 - stage forwards, then alternate one forward and one backward")
    return None


def warmup(order: list) -> int:
    """The forwards a stage runs before its first backward: 1F1B's min(microbatches, num_stages - stage) (its warm-up
    of num_stages - 1 - stage forwards, then the steady state's first)."""
    return next((i for i, (kind, _) in enumerate(order) if kind == "B"), len(order))


def schedule_length(orders: list) -> int:
    """The steps the stages take, each running its order as soon as what it waits for is done (a forward for the
    previous stage's forward of its micro-batch, a backward for the next stage's backward), one step an op."""
    stages, finished = len(orders), {}
    position, free = [0] * stages, [0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        for s in range(stages):
            while position[s] < len(orders[s]):
                kind, m = orders[s][position[s]]
                needs = (s - 1, "F", m) if kind == "F" else (s + 1, "B", m)
                if not 0 <= needs[0] < stages:
                    needs = (s, "F", m) if kind == "B" else None  # the last stage's backward follows its forward
                if needs is not None and needs not in finished:
                    break
                begin = max(free[s], finished[needs] if needs else 0)
                finished[(s, kind, m)] = free[s] = begin + 1
                position[s] += 1
    return max(free)


def read(one_f_one_b, cases=CASES) -> str | None:
    """The learner's one_f_one_b called for every stage at each (stages, micro-batches): the first mistake, or None."""
    try:
        for stages, microbatches in cases:
            mistake = order_mistake([one_f_one_b(s, stages, microbatches) for s in range(stages)], microbatches)
            if mistake:
                return mistake
    except Exception as error:  # noqa: BLE001  the learner's code: one line that names it
        first = (str(error).strip().splitlines() or [""])[0]
        return f"one_f_one_b() raised {type(error).__name__}: {first}"
    return None


def check_file(path: str, cases=CASES) -> str | None:
    """Import the learner's file by path and read the orders of one_f_one_b at each (stages, micro-batches)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("learner_pipeline_schedule", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001  the learner's code: one line that names it
        first = (str(error).strip().splitlines() or [""])[0]
        return f"one_f_one_b() raised {type(error).__name__}: {first}"
    return read(module.one_f_one_b, cases)


if __name__ == "__main__":  # python pipeline_orders.py LEARNER_FILE: prints the mistake, or nothing
    import sys

    print(check_file(sys.argv[1]) or "", end="")
