"""DDP Lessons: the notebook side of the course (launcher, widgets and plots, data)."""
from .launch import LaunchError, LaunchResult, as_terminal_shows, command_line, parse_result, torchrun
from .check import check
from .doctor import doctor
from .magic import load_ipython_extension  # %load_ext lessons: the %%torchrun cell magic
from .nodes import torchrun_nodes
from .python_launch import run_python

__all__ = ["LaunchError", "LaunchResult", "as_terminal_shows", "check", "command_line", "doctor", "parse_result",
           "run_python", "torchrun", "torchrun_nodes"]
