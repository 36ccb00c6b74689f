"""DDP Lessons: the notebook side of the course (launcher, widgets and plots, data)."""
from .launch import LaunchError, LaunchResult, as_terminal_shows, command_line, parse_result, torchrun

__all__ = ["LaunchError", "LaunchResult", "as_terminal_shows", "command_line", "parse_result", "torchrun"]
