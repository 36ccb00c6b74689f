"""The take-home tools: what a learner uses on scripts of their own, and what `pip install` of this repository is for.

- the launcher: `launch.torchrun` (and `nodes.torchrun_nodes`, `python_launch.run_python`), each rank's output,
  its failure and its stacks (`rank_output`, `failure`, `stacks`, `processes`, `live`);
- the DDP doctor: `doctor` (`python -m lessons doctor`, `ddp-doctor`), its instruments in `doctor_site/`, their
  events described in `doctor_events`;
- the exercise checker: `check` (`python -m lessons check`, `ddp-check`), its checks in `exercise_checks/`;
- the `%%torchrun` cell magic: `magic`.

They need torch, NumPy, psutil and py-spy, nothing of the course. Each lesson's own plumbing (plots, the ring, memory
tables, the sampler explorer, data) lives beside this package, in `lessons/`.
"""
