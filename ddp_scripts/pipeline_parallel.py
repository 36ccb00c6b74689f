"""Pipeline parallelism: one MLP cut into N stages, one per rank, micro-batches flowing through them.

    torchrun --standalone --nproc-per-node=2 pipeline_parallel.py --schedule 1f1b --microbatches 4 [--batch 8]
                                                                  [--impl torch]

--impl hand writes the schedule with send/recv; --impl torch runs the same model with torch.distributed.pipelining.
Checked against the whole MLP in one process: gradients of every stage, and the outputs of the last one.
"""
import argparse
import copy
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import ddp_common  # a clean exit, and the device

parser = argparse.ArgumentParser()
parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
parser.add_argument("--microbatches", type=int, default=4, help="M, a divisor of --batch")
parser.add_argument("--batch", type=int, default=8, help="the batch of one step, cut into M micro-batches")
parser.add_argument("--impl", choices=("hand", "torch"), default="hand")
options = parser.parse_args()
M, N, BATCH, WIDTH = options.microbatches, int(os.environ["WORLD_SIZE"]), options.batch, 16
if M < 1 or BATCH < 1 or BATCH % M:
    parser.error(f"--microbatches must divide --batch ({BATCH}): M = 32 needs --batch 32, M = 3 --batch 9")
if options.impl == "torch" and options.schedule == "1f1b" and M < N:  # Schedule1F1B.__init__ raises ValueError
    parser.error(f"torch's Schedule1F1B needs --microbatches >= the {N} stages")

backend, device = ddp_common.backend_and_device()
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))  # a schedule that deadlocks fails in 60 s
rank = dist.get_rank()

# The whole model, the same on every rank (same seed): each rank keeps its slice, the reference keeps all.
torch.manual_seed(0)
reference = torch.nn.Sequential(*[m for _ in range(2 * N) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())])
stage = copy.deepcopy(reference[4 * rank: 4 * rank + 4]).to(device)  # two Linear+Tanh per stage
x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
expected = reference(x)
torch.nn.functional.mse_loss(expected, y).backward()
first, last = rank == 0, rank == N - 1
x_mbs, y_mbs = x.to(device).chunk(M), y.to(device).chunk(M)

events, bytes_sent, peak, outputs = [], 0, 0, []


def timed(kind, m, work):
    """Run one F or B, timing the compute only: the recvs happen before, the sends after."""
    start = time.perf_counter()
    result = work()
    events.append((kind, m, start, time.perf_counter()))
    return result


def hand_order(schedule):
    """The (kind, micro-batch) list this rank runs. 1F1B: warm up, then one F one B, then drain."""
    if schedule == "gpipe":
        return [("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
    warmup = min(M, N - 1 - rank)  # the later the stage, the sooner its first backward can come
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, M):
        order += [("F", m), ("B", m - warmup)]
    return order + [("B", m) for m in range(M - warmup, M)]


def run_by_hand():
    global bytes_sent, peak
    stash, sends = {}, []  # stash: micro-batch -> (input, output or loss) kept for its backward
    shape = (BATCH // M, WIDTH)
    for kind, m in hand_order(options.schedule):
        if kind == "F":
            if first:
                inp = x_mbs[m]
            else:  # the previous stage's output is this stage's input; we need its gradient for the backward
                inp = torch.empty(shape, device=device)
                dist.recv(inp, src=rank - 1, tag=m)
                inp.requires_grad_()

            def forward():
                out = stage(inp)
                if last:  # each micro-batch's mean loss / M: the sum is the whole batch's mean loss
                    outputs.append(out.detach())
                    return torch.nn.functional.mse_loss(out, y_mbs[m]) / M
                return out
            stash[m] = (inp, timed("F", m, forward))
            peak = max(peak, len(stash))  # micro-batches whose activations this stage holds now
            if not last:  # isend: a blocking send could wait on a neighbour that is itself sending to us
                sends.append(dist.isend(stash[m][1].detach(), dst=rank + 1, tag=m))
                bytes_sent += stash[m][1].numel() * stash[m][1].element_size()
        else:
            inp, out = stash.pop(m)
            grad = None if last else torch.empty(shape, device=device)
            if grad is not None:  # tags keep the activations and the gradients apart
                dist.recv(grad, src=rank + 1, tag=M + m)
            timed("B", m, lambda: out.backward(grad))
            if not first:
                sends.append(dist.isend(inp.grad, dst=rank - 1, tag=M + m))
                bytes_sent += inp.grad.numel() * inp.grad.element_size()
    for work in sends:  # an isend is done only when waited on
        work.wait()


def run_with_torch():
    # No example shapes: step() infers them by running micro-batch 0 once more (forward, and autograd.grad)
    pipe = PipelineStage(stage, rank, N, device)
    for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):
        def wrapper(m, *args, _run=getattr(pipe, name), _kind=kind, **kwargs):  # record each F/B, change nothing
            global peak
            result = timed(_kind, m, lambda: _run(m, *args, **kwargs))
            peak = max(peak, len(pipe.fwd_cache))  # the stage's own stash: micro-batch -> (output, input)
            return result
        setattr(pipe, name, wrapper)
    for name in ("get_fwd_send_ops", "get_bwd_send_ops"):  # count what the schedule hands to isend
        def counted(m, _get=getattr(pipe, name)):
            global bytes_sent
            ops = _get(m)
            bytes_sent += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
            return ops
        setattr(pipe, name, counted)
    Schedule = ScheduleGPipe if options.schedule == "gpipe" else Schedule1F1B
    # mse_loss is a mean per micro-batch; scale_grads (default True) divides the gradients by M at the end
    schedule = Schedule(pipe, n_microbatches=M, loss_fn=torch.nn.functional.mse_loss)
    inputs, target = ((x.to(device),) if first else ()), ({"target": y.to(device)} if last else {})
    out = schedule.step(*inputs, **target)  # the whole batch: the schedule cuts it into M micro-batches
    if last:
        outputs.append(out.detach())


run_by_hand() if options.impl == "hand" else run_with_torch()

# The checks, on each rank: this stage's gradients (and the last stage's outputs) against the whole model.
grad_diff = max((p.grad.cpu() - q.grad).abs().max().item()
                for p, q in zip(stage.parameters(), reference[4 * rank: 4 * rank + 4].parameters()))
out_diff = (torch.cat(outputs).cpu() - expected.detach()).abs().max().item() if last else 0.0
every = [None] * N  # every rank's checks and events, for rank 0 to report
dist.all_gather_object(every, {"grad_diff": grad_diff, "out_diff": out_diff, "events": events, "peak": peak,
                               "bytes": bytes_sent})


def logical_timeline(orders):
    """Start unit of each op if F and B take one unit: after this stage's previous op and its neighbour's op."""
    done, clock, pending, start = {}, [0] * N, [list(o) for o in orders], [[] for _ in range(N)]
    while any(pending):
        for s in range(N):
            while pending[s]:
                kind, m = pending[s][0]
                needs = (s - 1, "F", m) if kind == "F" else (s + 1, "B", m)
                if 0 <= needs[0] < N and needs not in done:
                    break  # wait for the neighbour: it will be reached on a later sweep
                t = max(clock[s], done.get(needs, 0))
                start[s].append((f"{kind}{m}", t))
                done[(s, kind, m)] = clock[s] = t + 1
                pending[s].pop(0)
    return start, max(clock)


if rank == 0:
    orders = [[(kind, m) for kind, m, _, _ in r["events"]] for r in every]
    logical, total_units = logical_timeline(orders)
    bubble = (N * total_units - 2 * M * N) / (N * total_units)  # idle units over all units
    max_grad_diff, max_out_diff = max(r["grad_diff"] for r in every), every[-1]["out_diff"]
    t0 = min(e[2] for r in every for e in r["events"])
    print(f"pipeline ({options.impl}, {options.schedule}, N={N}, M={M}) grads == single-process grads "
          f"(max |diff| < 1e-6): {max_grad_diff < 1e-6}; outputs too: {max_out_diff < 1e-6}")
    print(f"bubble: {bubble:.3f} of the {total_units}-unit step; (N-1)/(M+N-1) = {(N - 1) / (M + N - 1):.3f}")
    print("RESULT " + json.dumps({
        "world_size": N, "schedule": options.schedule, "microbatches": M, "impl": options.impl,
        "matches_single_process": max_grad_diff < 1e-6 and max_out_diff < 1e-6,
        "max_grad_diff": max_grad_diff, "max_output_diff": max_out_diff,
        "bubble_fraction": bubble, "bubble_formula": (N - 1) / (M + N - 1),
        "peak_activations_per_stage": [r["peak"] for r in every],
        "timeline": [[f"{kind}{m}" for kind, m in order] for order in orders],
        "logical_timeline": logical, "total_units": total_units,
        "compute_ms": [[[f"{k}{m}", round(1e3 * (a - t0), 3), round(1e3 * (b - t0), 3)]
                        for k, m, a, b in r["events"]] for r in every],  # perf_counter: one clock on one machine
        "bytes_sent_per_step": sum(r["bytes"] for r in every)}))
dist.destroy_process_group()
