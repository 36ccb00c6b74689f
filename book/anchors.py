"""The anchor JupyterLab gives a heading, for MyST (book/conf.py): an importable function, so Sphinx's parallel
workers can pickle the setting."""
import re


def jupyterlab_slug(title: str) -> str:
    """"6. The helper" -> "6.-The-helper": the cheat-sheet's links, and the notebooks' own, then land on the same
    section in JupyterLab and on the site."""
    return re.sub(r"\s", "-", title.strip())
