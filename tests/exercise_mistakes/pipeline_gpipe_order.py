"""A typical mistake in exercises/pipeline_schedule.py: GPipe's order (every forward, then every backward): right
gradients, no deadlock, but every stage holds all the micro-batches' activations."""


def one_f_one_b(stage, num_stages, microbatches):
    return [("F", m) for m in range(microbatches)] + [("B", m) for m in reversed(range(microbatches))]
