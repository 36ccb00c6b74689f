"""make gpu-check (lessons/gpu_check.py) without a GPU: which cells it picks, what its report says, and its one line
on a machine without CUDA. Nothing here starts a kernel or a launch; the GPU run itself needs a GPU."""
import subprocess
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from conftest import ROOT
from lessons import gpu_check
from lessons.gpu_check import CellResult, GpuCell, gpu_cells, gpu_cells_of, report_markdown, status_of

# (notebook, cell index, GPUs needed): a new GPU cell must be added here on purpose, and so to the GPU run.
GPU_CELLS = [
    ("01_dataparallel.ipynb", 6, 2),
    ("02b_ring_allreduce_from_scratch.ipynb", 21, 2),
    ("06_data_loading.ipynb", 16, 1),
    ("06b_where_the_time_goes.ipynb", 29, 2),
    ("07_checkpoints.ipynb", 16, 1),
    ("08b_syncbatchnorm_in_a_model.ipynb", 10, 2),
    ("09_gradient_accumulation.ipynb", 12, 1),
    ("11_debugging.ipynb", 21, 2),
    ("12b_zero_dcp_and_activations.ipynb", 17, 1),
    ("13_training_loop.ipynb", 11, 2),
    ("15c_context_parallelism.ipynb", 17, 2),
    ("15d_expert_parallelism.ipynb", 14, 1),
]


def test_the_course_has_these_gpu_cells():
    """The pinned list: lesson 00's and 99's GPU count (an f-string, a conditional expression) are not GPU cells."""
    found = gpu_cells(ROOT / "notebooks")
    assert [(cell.notebook, cell.index, cell.gpus_needed) for cell in found] == GPU_CELLS
    by_place = {(cell.notebook, cell.index): cell.section for cell in found}
    assert by_place[("07_checkpoints.ipynb", 16)] == "3. `map_location`: why every rank lands on GPU 0"


def selected(*sources: str) -> list[tuple[int, int]]:
    """(cell index, GPUs needed) of the cells picked in a notebook of one heading and these code cells."""
    notebook = new_notebook(cells=[new_markdown_cell("# Title\n\n## 1. A section"), *map(new_code_cell, sources)])
    return [(cell.index, cell.gpus_needed) for cell in gpu_cells_of(notebook, "made_up.ipynb")]


def test_a_mention_of_cuda_is_not_a_gpu_cell():
    """Only an `if` statement at the top of the cell counts: the same test in a comment, a string, a conditional
    expression or an assignment runs on every machine. The controls (the last three) are picked."""
    assert selected(
        "# if torch.cuda.is_available(): run on the GPU",
        'print("if torch.cuda.device_count() >= 2: nccl")',
        'print("Lessons here run on:", "nccl" if torch.cuda.device_count() >= 2 else "gloo")',
        'print(f"GPUs: {torch.cuda.device_count()}, CUDA available: {torch.cuda.is_available()}")',
        "two = torch.cuda.device_count() >= 2",
        "def f():\n    if torch.cuda.is_available():\n        pass",  # inside a function: not the cell's own branch
        "%%writefile ../ddp_scripts/x.py\nif torch.cuda.is_available():\n    pass",  # a script, not this cell
        'lessons.check("ex")\nif torch.cuda.is_available():\n    pass',  # an exercise check
        "if torch.cuda.is_available():\n    pass",
        "%load_ext lessons\n!nvidia-smi\nif torch.cuda.device_count() >= 2:  # two ranks\n    pass\nelse:\n    pass",
        "import torch\n\nif torch.cuda.device_count() > 3:\n    pass",
    ) == [(9, 1), (10, 2), (11, 4)]


def test_each_cell_is_named_by_the_last_section_above_it():
    notebook = new_notebook(cells=[
        new_markdown_cell("# 05 · Title"), new_code_cell("if torch.cuda.is_available():\n    pass"),
        new_markdown_cell("## 1. First\n\ntext\n\n### a subsection"), new_markdown_cell("Prose, no heading."),
        new_code_cell("if torch.cuda.device_count() >= 2:\n    pass")])
    assert [cell.section for cell in gpu_cells_of(notebook, "05.ipynb")] == ["(before the first section)", "1. First"]


MACHINE = {"date": "2030-01-02 03:04", "device": "NVIDIA H100 80GB HBM3", "gpus": 1, "torch": "2.9.0+cu128",
           "cuda": "12.8", "command": "python -m lessons.gpu_check"}


def stream(text: str):
    return new_output("stream", name="stdout", text=text)


def test_status_says_ran_error_or_a_check_to_read():
    """The verdict is a heuristic on the words a check prints; an error wins over any printed word."""
    assert status_of([stream("host->device, pinned: 24.1 GB/s\n")]) == "ran: no check printed False or FAILS"
    assert status_of([stream("no_sync lower: False\n")]) == "ran: a check printed False or FAILS (read the output)"
    assert status_of([new_output("execute_result", data={"text/plain": "'FAILS'"}, execution_count=1)]) == \
        "ran: a check printed False or FAILS (read the output)"
    # an argument's value is no verdict: lesson 12b's GPU cell prints both cases, and each check holds
    assert status_of([stream("checkpointed=False: forward keeps 524,288 bytes; from the CPU count 524,288: True\n")]) \
        == "ran: no check printed False or FAILS"
    assert status_of([stream("True\n"), new_output("error", ename="OutOfMemoryError", evalue="CUDA out of memory",
                                                   traceback=[])]) == "error: OutOfMemoryError: CUDA out of memory"


def test_the_report_has_the_machine_a_table_and_each_cells_output():
    """Written from plain data, so its format is checked here without a GPU; each status kind once."""
    cells = [GpuCell("06_data_loading.ipynb", 16, "`pin_memory=True` and `non_blocking=True`", 1),
             GpuCell("07_checkpoints.ipynb", 16, "3. `map_location`: why every rank | lands on GPU 0", 1),
             GpuCell("09_gradient_accumulation.ipynb", 12, "Does `no_sync` lower memory?", 1),
             GpuCell("13_training_loop.ipynb", 9, "2. Mixed precision", 2)]
    results = [CellResult(cells[0], "ran: no check printed False or FAILS", "host->device, pinned: 24.1 GB/s\n"),
               CellResult(cells[1], "ran: a check printed False or FAILS (read the output)", "a ```fence``` False\n"),
               CellResult(cells[2], "error: OutOfMemoryError: CUDA out of memory", "OutOfMemoryError: CUDA out of\n"),
               CellResult(cells[3], "not run: needs 2 GPUs, 1 here", None)]
    report = report_markdown(MACHINE, results)
    lines = report.splitlines()
    assert lines[0] == "# GPU evidence: the course's GPU-only cells, run on a GPU"
    for fact in ("- date (UTC): 2030-01-02 03:04", "- device: NVIDIA H100 80GB HBM3", "- GPUs: 1",
                 "- torch: 2.9.0+cu128", "- CUDA: 12.8", "- command: `python -m lessons.gpu_check`"):
        assert fact in lines
    assert "The status is a heuristic" in report
    table = lines[lines.index("| notebook | section | GPUs needed | status |") + 2:][:4]
    assert table == [
        "| 06_data_loading.ipynb, cell 16 | `pin_memory=True` and `non_blocking=True` | 1 | ran: no check printed "
        "False or FAILS |",
        "| 07_checkpoints.ipynb, cell 16 | 3. `map_location`: why every rank \\| lands on GPU 0 | 1 | ran: a check "
        "printed False or FAILS (read the output) |",
        "| 09_gradient_accumulation.ipynb, cell 12 | Does `no_sync` lower memory? | 1 | error: OutOfMemoryError: CUDA "
        "out of memory |",
        "| 13_training_loop.ipynb, cell 9 | 2. Mixed precision | 2 | not run: needs 2 GPUs, 1 here |"]
    assert ("## 06_data_loading.ipynb, cell 16: `pin_memory=True` and `non_blocking=True`\n\n"
            "Status: ran: no check printed False or FAILS\n\n```text\nhost->device, pinned: 24.1 GB/s\n```\n") in report
    assert "\n````text\na ```fence``` False\n````\n" in report  # a longer fence than the output's own
    assert report.endswith("## 13_training_loop.ipynb, cell 9: 2. Mixed precision\n\n"
                           "Status: not run: needs 2 GPUs, 1 here\n")  # no output block for a cell that did not run


def test_a_notebook_whose_cells_all_need_more_gpus_is_not_executed(monkeypatch):
    monkeypatch.setattr(gpu_check, "execute_copy", lambda *args: pytest.fail("executed a notebook it cannot use"))
    cells = [GpuCell("13_training_loop.ipynb", 9, "2. Mixed precision", 2)]
    assert gpu_check.results_of_notebook(ROOT / "notebooks" / "13_training_loop.ipynb", cells, 1, ROOT) == \
        [CellResult(cells[0], "not run: needs 2 GPUs, 1 here", None)]


def test_outputs_are_read_from_the_executed_copy(monkeypatch, capsys):
    """Which outputs count: the executed copy's (the committed ones are CPU runs), and a cell the run never
    finished (a dead kernel, a cell past the timeout) is an error that keeps what it printed."""
    notebook = new_notebook(cells=[new_markdown_cell("## GPUs"), new_code_cell(execution_count=1, outputs=[
        stream("cuda:0 allocated: +1,024 bytes\n")]), new_code_cell(outputs=[stream("started\n")]), new_code_cell()])
    monkeypatch.setattr(gpu_check, "execute_copy", lambda *args: (notebook, "DeadKernelError: Kernel died"))
    cells = [GpuCell("x.ipynb", 1, "GPUs", 1), GpuCell("x.ipynb", 2, "GPUs", 1), GpuCell("x.ipynb", 3, "GPUs", 1)]
    assert gpu_check.results_of_notebook(ROOT / "x.ipynb", cells, 1, ROOT) == [
        CellResult(cells[0], "ran: no check printed False or FAILS", "cuda:0 allocated: +1,024 bytes\n"),
        CellResult(cells[1], "error: the notebook stopped before this cell finished (DeadKernelError: Kernel died)",
                   "started\n"),
        CellResult(cells[2], "error: the notebook stopped before this cell finished (DeadKernelError: Kernel died)",
                   None)]
    assert capsys.readouterr().out == "gpu-check: running x.ipynb ...\n"


def test_without_cuda_it_says_so_in_one_line_and_writes_nothing(monkeypatch, capsys, tmp_path):
    """make gpu-check on a laptop: one line, exit 0, no report. CUDA is switched off here so that the test is the
    same on a machine with a GPU (where main() would run every GPU notebook)."""
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    report = tmp_path / "gpu_report.md"
    assert gpu_check.main(["--report", str(report)]) == 0
    printed = capsys.readouterr()
    assert printed.err == "" and printed.out.count("\n") == 1
    assert printed.out.startswith("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False): nothing to run;")
    assert f"runs the course's {len(GPU_CELLS)} GPU cells and {len(gpu_check.SCRIPT_RUNS)} launches of lessons 14c, " \
           f"15, 15c and 15d, and writes {report}" in printed.out
    assert not report.exists() and list(tmp_path.iterdir()) == []


def test_the_report_is_written_after_each_notebook(tmp_path):
    """A later notebook that hangs past the device's time limit must not cost the evidence of those that finished."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name in ("01_a.ipynb", "02_b.ipynb"):
        nbformat.write(new_notebook(cells=[new_code_cell("if torch.cuda.device_count() >= 2:\n    pass")]),
                       notebooks / name)
    seen = []
    gpu_check.run_gpu_cells(notebooks, 1, after_each=lambda so_far: seen.append([r.cell.notebook for r in so_far]))
    assert seen == [["01_a.ipynb"], ["01_a.ipynb", "02_b.ipynb"]]


# --- The scripts that choose a device: a GPU for each rank, else gloo on the CPU (issue 45) --------------------------

def load_script(name):
    """A file of ddp_scripts/ as a module of its own (the scripts import ddp_common by their folder on sys.path; the
    template's main() runs only as __main__)."""
    import importlib.util
    from conftest import SCRIPTS
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_ddp_common():
    return load_script("ddp_common")


RULE_CASES = [  # GPUs this rank sees, ranks on this machine, CUDA_VISIBLE_DEVICES, DDP_BACKEND -> choice (LOCAL_RANK 1)
    (0, 2, None, None, "gloo cpu"), (1, 4, None, None, "gloo cpu"), (1, 2, None, None, "gloo cpu"),
    (2, 2, None, None, "nccl cuda:1"), (8, 4, None, None, "nccl cuda:1"), (2, 2, "0,1", None, "nccl cuda:1"),
    (1, 2, "1", None, "nccl cuda:0"),  # the launcher showed this rank its own GPU: device_count() is 1
    (1, 2, "GPU-6f1c", None, "nccl cuda:0"),  # a UUID, as Slurm may give
    (2, 4, "0,1", None, "gloo cpu"),  # two visible, four ranks: not one each
    (0, 2, None, "gloo", "gloo cpu"), (2, 2, None, "gloo", "gloo cpu"),  # chosen for every node: no fallback line
    (2, 2, None, "nccl", "nccl cuda:1"), (1, 2, "1", "nccl", "nccl cuda:0"),
    (1, 2, None, "nccl", "DDP_BACKEND=nccl, 1 GPU(s) for 2 ranks here: nccl needs one a rank, gloo none"),
    (0, 2, None, "mpi", "DDP_BACKEND=mpi, 0 GPU(s) for 2 ranks here: nccl needs one a rank, gloo none"),
]


@pytest.mark.parametrize("script", ["ddp_common", "template"])
@pytest.mark.parametrize("gpus, ranks, visible, chosen_backend, expected", RULE_CASES)
def test_a_rank_gets_a_gpu_only_when_it_has_one_of_its_own(monkeypatch, capsys, script, gpus, ranks, visible,
                                                            chosen_backend, expected):
    """The fewer-GPUs-than-ranks machine (a 1-GPU laptop, 4 ranks) falls back to the CPU and says so in the line
    gpu-check reads; a GPU per rank gets cuda:LOCAL_RANK and set_device; a rank shown only its own GPU (one device in
    CUDA_VISIBLE_DEVICES, so device_count() is 1) uses it; DDP_BACKEND decides for every node alike, and a choice
    that cannot run is one line. Torch cannot fake a device count in a launch, so the count is faked here, in the
    one function every such script calls, and in the template's copy of it (the same rule, the same table)."""
    module = load_script(script)
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    for name, value in (("CUDA_VISIBLE_DEVICES", visible), ("DDP_BACKEND", chosen_backend)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    try:
        backend, device = module.backend_and_device()
    except SystemExit as stop:
        assert str(stop) == expected and chosen == []
        return
    assert f"{backend} {device}" == expected
    said = capsys.readouterr().err
    assert bool(gpu_check.FELL_BACK.search(said)) == (backend == "gloo" and gpus > 0 and not chosen_backend), said
    assert chosen == ([device.index] if backend == "nccl" else [])


def test_every_script_that_may_use_a_gpu_chooses_it_by_the_one_rule():
    """No script sets its device from torch.cuda.is_available() alone (lessons 14c and 15 did, and failed with an
    invalid device ordinal on a 1-GPU machine): set_device only in ddp_common and the template (which has the same
    rule, since it imports nothing of ours). And gpu-check launches every script
    of 14c, 15, 15c and 15d that picks a device."""
    from conftest import SCRIPTS
    for script in sorted(SCRIPTS.glob("*.py")):
        text = script.read_text()
        code = "\n".join(line.split("#")[0] for line in text.splitlines())  # comments may name it
        if script.name not in ("ddp_common.py", "template.py"):
            assert "torch.cuda.set_device(" not in code and 'accelerator="gpu" if torch.cuda.is_available()' not in text and \
                "Accelerator(cpu=not torch.cuda.is_available())" not in text, script.name
    template = (SCRIPTS / "template.py").read_text()  # its copy of the rule is tested with ddp_common's, above
    assert "backend, device = backend_and_device()" in template
    launched = {script for script, _, _ in gpu_check.SCRIPT_RUNS}
    assert launched == {"digits_accelerate.py", "digits_lightning.py", "device_mesh_tour.py", "hsdp.py",
                        "tensor_parallel.py", "layouts.py", "context_parallel.py", "expert_parallel.py"}
    for script in launched:
        assert "backend_and_device()" in (SCRIPTS / script).read_text(), script


def test_a_script_run_says_where_it_ran(monkeypatch):
    """gpu-check's status from what the launch printed: the fallback line, a failure, or the GPUs."""
    outputs = {"a.py": (0, "1 GPU(s) for 4 ranks on this machine: using gloo on the CPU\n"),
               "b.py": (0, "RESULT {}\n"), "c.py": (1, "torch.AcceleratorError: CUDA error: invalid device ordinal\n")}

    def fake_run(command, **_):
        code, text = outputs[Path(command[5]).name]
        return subprocess.CompletedProcess(command, code, stdout="", stderr=text)
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    assert [gpu_check.run_script(name, 4, []).status for name in outputs] == [
        "on the CPU: 1 GPU(s) for 4 ranks on this machine: using gloo on the CPU", "on the GPUs", "failed: exit 1"]
