"""A solution of exercises/pipeline_schedule.py: warm up, one forward one backward, drain."""


def one_f_one_b(stage: int, num_stages: int, microbatches: int) -> list[tuple[str, int]]:
    warmup = min(microbatches, num_stages - 1 - stage)  # the later the stage, the sooner its first gradient comes
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, microbatches):  # steady state: each new forward, then the oldest backward
        order += [("F", m), ("B", m - warmup)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]  # drain
