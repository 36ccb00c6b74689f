"""make gpu-check, or python -m lessons.gpu_check [--notebooks DIR] [--report PATH]: the GPU-only cells, on a GPU.

Every notebook runs on a laptop: a cell that needs a GPU tests for one (`if torch.cuda.is_available():` or
`if torch.cuda.device_count() >= 2:`) and otherwise prints what it skipped. Those branches never run in `make test`.
On a machine with CUDA, this executes each notebook that has such a cell (a copy in memory: the committed notebook
is never written), and writes what every GPU cell printed to notebooks/gpu_report.md. It then launches the scripts
of lessons 14c, 15, 15c and 15d (SCRIPT_RUNS) at the lesson's world size: on GPUs when there is one for each rank,
else on the CPU with gloo, which the script says (ddp_common.backend_and_device). Without CUDA it says so in one line
and writes nothing.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
REPORT = NOTEBOOKS / "gpu_report.md"
CELL_TIMEOUT_S = 900  # the slowest GPU cell launches torchrun with timeout=300; a cell past 15 min is stuck
SCRIPT_TIMEOUT_S = 300
# (script in ddp_scripts/, ranks, arguments): the lessons' launches whose scripts choose a device themselves.
SCRIPT_RUNS = [
    ("digits_accelerate.py", 2, ["--epochs", "1", "--save", "accelerate.pt"]),
    ("digits_accelerate.py", 1, ["--epochs", "1", "--save", "one.pt"]),
    ("digits_lightning.py", 2, ["--epochs", "1", "--save", "lightning.pt"]),
    ("digits_lightning.py", 1, ["--epochs", "1", "--save", "one.pt"]),
    ("device_mesh_tour.py", 4, []),
    ("hsdp.py", 4, []),
    ("tensor_parallel.py", 2, []),
    ("layouts.py", 4, []),
    ("context_parallel.py", 4, ["--seq-len", "64", "--cases",
                                "ring,ring+causal,ring+causal+zigzag,ulysses,ulysses+causal"]),
    ("expert_parallel.py", 4, ["--experts", "4", "--top-k", "2", "--capacity-factor", "1.0", "--dp", "2"]),
]
FELL_BACK = re.compile(r"\d+ GPU\(s\) for \d+ ranks on this machine: using gloo on the CPU")


@dataclass(frozen=True)
class GpuCell:
    notebook: str  # file name, e.g. "06_data_loading.ipynb"
    index: int  # position in the notebook's cells, markdown cells counted
    section: str  # the last "## ..." heading above the cell
    gpus_needed: int


@dataclass(frozen=True)
class CellResult:
    cell: GpuCell
    status: str  # "ran: ...", "error: ...", "not run: ..."
    output: str | None  # what the cell printed; None when it did not run


# --- Which cells need a GPU ---------------------------------------------------------------------------------------

def is_call_to(node: ast.AST, dotted: str) -> bool:
    """node is `torch.cuda.is_available()` (no arguments) for dotted="torch.cuda.is_available"."""
    return isinstance(node, ast.Call) and not node.args and ast.unparse(node.func) == dotted


def gpus_tested_by(test: ast.expr) -> int:
    """How many GPUs an `if` test asks for: 1 for torch.cuda.is_available(), N for torch.cuda.device_count() >= N
    (N + 1 for > N); 0 when it tests neither. `not ...` and `... and ...` count too: either way, a branch needs it."""
    needed = 0
    for node in ast.walk(test):
        if is_call_to(node, "torch.cuda.is_available"):
            needed = max(needed, 1)
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and is_call_to(node.left, "torch.cuda.device_count")
              and isinstance(node.comparators[0], ast.Constant) and isinstance(node.comparators[0].value, int)):
            bound = node.comparators[0].value
            needed = max(needed, {ast.GtE: bound, ast.Gt: bound + 1}.get(type(node.ops[0]), 0))
    return needed


def without_magics(source: str) -> str:
    """The cell as plain Python: IPython's %magic and !shell lines dropped."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def gpus_needed(source: str) -> int:
    """GPUs a code cell's top-level `if` statements test for (0: not a GPU cell). A mention in a comment, a string,
    or a conditional expression (`"nccl" if torch.cuda.device_count() >= 2 else "gloo"`) is not an `if` statement."""
    if source.startswith("%%writefile") or "lessons.check(" in source:
        return 0  # a script the cell writes, or an exercise check: not this notebook's own GPU branch
    try:
        module = ast.parse(without_magics(source))
    except SyntaxError:
        return 0
    return max((gpus_tested_by(node.test) for node in module.body if isinstance(node, ast.If)), default=0)


def heading_of(source: str) -> str | None:
    """The last "## " heading in a markdown cell, without the hashes."""
    headings = [line[3:].strip() for line in source.splitlines() if line.startswith("## ")]
    return headings[-1] if headings else None


def read_notebook(path: Path) -> nbformat.NotebookNode:
    import nbformat  # here, not at the top: --scripts-only runs where only torch and the libraries are installed
    return nbformat.read(path, as_version=4)


def gpu_cells_of(notebook: nbformat.NotebookNode, name: str) -> list[GpuCell]:
    found, section = [], "(before the first section)"
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            section = heading_of(cell.source) or section
        elif cell.cell_type == "code" and (needed := gpus_needed(cell.source)):
            found.append(GpuCell(name, index, section, needed))
    return found


def gpu_cells(notebooks_dir: Path) -> list[GpuCell]:
    """Every GPU-only cell of the course, in notebook order."""
    return [cell for path in sorted(Path(notebooks_dir).glob("*.ipynb"))
            for cell in gpu_cells_of(read_notebook(path), path.name)]


# --- Running them --------------------------------------------------------------------------------------------------

def printed_text(outputs: list) -> str:
    """What a cell showed as text: its streams, the text/plain of its results, and its error's name and value."""
    parts = []
    for output in outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"] + "\n")
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}\n")
    return "".join(parts)


def status_of(outputs: list) -> str:
    """A heuristic verdict: the course's checks print True/False or PASSES/FAILS; a False or FAILS is worth a look."""
    errors = [output for output in outputs if output.output_type == "error"]
    if errors:
        return f"error: {errors[0].ename}: {errors[0].evalue}"
    text = printed_text(outputs)
    if re.search(r"(?<![=\w])False\b|\bFAILS\b", text):  # a verdict, not an argument (checkpointed=False)
        return "ran: a check printed False or FAILS (read the output)"
    return "ran: no check printed False or FAILS"


def not_run(cell: GpuCell, gpus_here: int) -> CellResult:
    return CellResult(cell, f"not run: needs {cell.gpus_needed} GPUs, {gpus_here} here", None)


def execute_copy(path: Path, notebooks_dir: Path) -> tuple[nbformat.NotebookNode, str | None]:
    """Run the whole notebook in memory, from the notebooks folder as Jupyter would; the file is never written.
    Returns the executed copy and, if the run stopped early (a dead kernel, a stuck cell), why."""
    from nbclient import NotebookClient  # only needed where there is a GPU

    notebook = read_notebook(path)
    for cell in notebook.cells:  # the committed (CPU) outputs must not pass for this run's
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(notebooks_dir)}})
    try:
        client.execute()
    except Exception as stopped:  # noqa: BLE001  one notebook's failure must not cost the others' evidence
        return notebook, f"{type(stopped).__name__}: {first_line(str(stopped))}"
    return notebook, None


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def results_of_notebook(path: Path, cells: list[GpuCell], gpus_here: int, notebooks_dir: Path) -> list[CellResult]:
    """Run the notebook if any of its GPU cells can run here, and read each GPU cell's outputs."""
    if all(cell.gpus_needed > gpus_here for cell in cells):
        return [not_run(cell, gpus_here) for cell in cells]
    print(f"gpu-check: running {path.name} ...", flush=True)
    executed, stopped = execute_copy(path, notebooks_dir)
    results = []
    for cell in cells:
        ran = executed.cells[cell.index]
        if cell.gpus_needed > gpus_here:
            results.append(not_run(cell, gpus_here))
        elif ran.execution_count is None:  # the run stopped before this cell, or in it: keep what it printed
            results.append(CellResult(cell, f"error: the notebook stopped before this cell finished ({stopped})",
                                      printed_text(ran.outputs) or None))
        else:
            results.append(CellResult(cell, status_of(ran.outputs), printed_text(ran.outputs)))
    return results


def run_gpu_cells(notebooks_dir: Path, gpus_here: int, after_each=None) -> list[CellResult]:
    """Each notebook with GPU cells, in order. after_each(results so far) is called after every notebook, so a
    report written there keeps the evidence of the notebooks that finished if a later one is stopped."""
    cells = gpu_cells(notebooks_dir)
    results = []
    for name in dict.fromkeys(cell.notebook for cell in cells):  # each notebook once, in order
        ours = [cell for cell in cells if cell.notebook == name]
        results += results_of_notebook(Path(notebooks_dir) / name, ours, gpus_here, Path(notebooks_dir))
        if after_each is not None:
            after_each(results)
    return results


@dataclass(frozen=True)
class ScriptResult:
    command: str
    status: str  # "on the GPUs", "on the CPU: N GPU(s) for M ranks ...", "failed: exit N", "stopped: ..."
    output: str


def run_script(script: str, ranks: int, arguments: list[str]) -> ScriptResult:
    """One launch under torchrun, in a scratch folder (the scripts write their checkpoints where they run)."""
    command = ["torchrun", "--standalone", f"--nproc-per-node={ranks}", f"ddp_scripts/{script}", *arguments]
    print(f"gpu-check: {' '.join(command)} ...", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *command[1:3],
                                   str(ROOT / command[3]), *arguments], cwd=scratch, capture_output=True, text=True,
                                  timeout=SCRIPT_TIMEOUT_S)
        except subprocess.TimeoutExpired as stopped:
            output = (stopped.stdout or b"").decode() + (stopped.stderr or b"").decode()
            return ScriptResult(" ".join(command), f"stopped: past {SCRIPT_TIMEOUT_S} s", output)
    output = done.stdout + done.stderr
    fell_back = FELL_BACK.search(output)
    if done.returncode:
        status = f"failed: exit {done.returncode}"
    else:
        status = f"on the CPU: {fell_back.group(0)}" if fell_back else "on the GPUs"
    return ScriptResult(" ".join(command), status, output)


# --- The report ----------------------------------------------------------------------------------------------------

def fenced(text: str) -> str:
    """text in a fenced block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text.rstrip()}\n{fence}"


def table_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report_markdown(machine: dict, results: list[CellResult], scripts: list[ScriptResult] = ()) -> str:
    """The report, from the machine's facts (date, device, gpus, torch, cuda, command) and each cell's result."""
    lines = [
        "# GPU evidence: the course's GPU-only cells, run on a GPU",
        "",
        f"- date (UTC): {machine['date']}",
        f"- device: {machine['device']}",
        f"- GPUs: {machine['gpus']}",
        f"- torch: {machine['torch']}",
        f"- CUDA: {machine['cuda']}",
        f"- command: `{machine['command']}`",
        "",
        "Each notebook with a GPU cell that can run here was executed whole, from a copy. The status is a heuristic: "
        "it looks for the words False and FAILS in the output; read the output before trusting a verdict.",
        "",
        "| notebook | section | GPUs needed | status |",
        "|---|---|---|---|",
    ]
    for result in results:
        cell = result.cell
        lines.append(f"| {cell.notebook}, cell {cell.index} | {table_cell(cell.section)} | {cell.gpus_needed} | "
                     f"{table_cell(result.status)} |")
    for result in results:
        cell = result.cell
        lines += ["", f"## {cell.notebook}, cell {cell.index}: {cell.section}", "", f"Status: {result.status}"]
        if result.output is not None:
            lines += ["", fenced(result.output or "(no output)")]
    if scripts:
        lines += ["", "## The scripts that choose their device: lessons 14c, 15, 15c and 15d", "",
                  "Each ran at its lesson's world size: on GPUs when there is one for each rank, else on the CPU "
                  "with gloo, as the script says.", "", "| command | status |", "|---|---|"]
        lines += [f"| `{run.command}` | {table_cell(run.status)} |" for run in scripts]
        for run in scripts:
            lines += ["", f"### `{run.command}`", "", f"Status: {run.status}", "", fenced(run.output or "(no output)")]
    return "\n".join(lines) + "\n"


def machine_facts(command: str) -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "command": command}


def shown(path: Path) -> str:
    """A path as the reader would type it: relative to the current folder when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lessons.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="the folder of the course's notebooks")
    parser.add_argument("--report", type=Path, default=REPORT, help="where to write the report (markdown)")
    parser.add_argument("--scripts-only", action="store_true", help="launch SCRIPT_RUNS, not the notebooks' cells")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False): nothing to run; on a machine with "
              f"one, this command runs the course's {len(gpu_cells(args.notebooks))} GPU cells and "
              f"{len(SCRIPT_RUNS)} launches of lessons 14c, 15, 15c and 15d, and writes "
              f"{shown(args.report)}")
        return 0
    command = " ".join(["python -m lessons.gpu_check", *(sys.argv[1:] if argv is None else argv)])
    facts = machine_facts(command)
    results = [] if args.scripts_only else run_gpu_cells(
        args.notebooks, torch.cuda.device_count(),
        after_each=lambda so_far: args.report.write_text(report_markdown(facts, so_far)))
    scripts = []
    for script, ranks, arguments in SCRIPT_RUNS:
        scripts.append(run_script(script, ranks, arguments))
        args.report.write_text(report_markdown(facts, results, scripts))
    ran = sum(result.output is not None for result in results)
    failed = [run.command for run in scripts if not run.status.startswith("on the")]
    print(f"gpu-check: {ran} of {len(results)} GPU cells ran; {len(scripts) - len(failed)} of {len(scripts)} scripts "
          f"ran{': failed ' + '; '.join(failed) if failed else ''}; the report is {shown(args.report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
