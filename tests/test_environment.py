"""environment.yml (conda) names the same packages as pyproject.toml, with the pins of constraints.txt."""
import json
import re
import tomllib

from conftest import ROOT


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def conda_pip_requirements() -> list[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    return [ln.strip()[2:] for ln in lines[start + 1:] if ln.startswith("      - ")]


def test_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {name_of(r) for r in project["dependencies"] + extras["course"] + extras["test"] + extras["site"]}
    conda = {name_of(r) for r in conda_pip_requirements() if not r.startswith("-e")}
    assert conda == wanted


def test_conda_pins_are_the_constraints():
    pins = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert pins, "constraints.txt pins nothing"
    for pin in pins:
        assert pin in conda_pip_requirements(), f"environment.yml does not pin {pin}"
    assert "-e ." in conda_pip_requirements(), "environment.yml does not install the lessons package"


def test_the_dev_container_sets_up_the_course_as_the_readme_says():
    """.devcontainer/devcontainer.json (JSON with comments): Python 3.11 as environment.yml, make setup on creation,
    JupyterLab's port forwarded."""
    text = (ROOT / ".devcontainer" / "devcontainer.json").read_text()
    config = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
    assert config["postCreateCommand"] == "make setup"
    assert "python:3.11" in config["image"] and "python=3.11" in (ROOT / "environment.yml").read_text()
    assert 8888 in config["forwardPorts"] and config["hostRequirements"]["cpus"] == 2
