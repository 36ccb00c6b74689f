"""DDP Lessons: the take-home tools (lessons/tools/: the launcher, the doctor, the exercise checker, the %%torchrun
magic), and each lesson's plumbing beside them (plots, the ring, memory, the sampler explorer, data)."""
from .tools.check import check
from .tools.doctor import doctor
from .tools.launch import LaunchError, LaunchResult, as_terminal_shows, command_line, parse_result, torchrun
from .tools.magic import load_ipython_extension  # %load_ext lessons: the %%torchrun cell magic
from .tools.nodes import torchrun_nodes
from .tools.python_launch import run_python

__all__ = ["LaunchError", "LaunchResult", "as_terminal_shows", "check", "command_line", "doctor", "parse_result",
           "run_python", "torchrun", "torchrun_nodes"]
