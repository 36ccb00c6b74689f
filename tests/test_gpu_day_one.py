"""GPU_DAY_ONE.md: every command on the page either runs here, on the CPU, as the page says it does, or is marked
`# GPU only`. A command added to the page without one or the other fails this test."""
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "GPU_DAY_ONE.md"
TEMPLATE_RUN = "torchrun --standalone --nproc-per-node=2 ddp_scripts/template.py --epochs 1"
# each command the page shows that runs on a CPU, and what its output must hold there
RUNS = {
    'python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(),'
    ' torch.cuda.device_count())"': "False 0" if not torch.cuda.is_available() else "True",
    f"DDP_BACKEND=gloo {TEMPLATE_RUN}": "RESULT ",
    f"TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=INFO {TEMPLATE_RUN}": "DDP Initialized with",
    "make gpu-check": "gpu-check: " if torch.cuda.is_available() else "gpu-check: no CUDA GPU here",
}


def page_commands() -> list[str]:
    """The commands in the page's bash blocks, one a line, their trailing comments kept (the GPU only mark)."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_every_command_runs_here_or_is_marked_gpu_only():
    commands = page_commands()
    unmarked = {c.split("  #")[0].strip() for c in commands if "GPU only" not in c}
    assert unmarked == set(RUNS), unmarked ^ set(RUNS)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command, expected in RUNS.items():
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        said = done.stdout + done.stderr
        assert done.returncode == 0 and expected in said, f"{command}\n{said[-3000:]}"
        assert "using gloo on the CPU" not in said, said  # DDP_BACKEND chosen, or no GPU: no fallback line
