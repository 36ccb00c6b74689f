"""CHEATSHEET.md's error rows quote torch 2.14 word for word. Each quoted piece must still be in the installed torch (its
Python files, or its compiled libraries and the NCCL and CUDA runtime it ships with), so an upgrade that rewords one
fails here: that is how a row marked "(needs GPUs; not run here)" is checked on a CPU. The errors a CPU can raise are
raised, each next to the row's fix (the control)."""
import mmap
import re
from functools import cache
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import lessons
from conftest import ROOT, SCRIPTS

SITE_PACKAGES = Path(torch.__file__).resolve().parent.parent
GPU_ONLY = "(needs GPUs; not run here"

# (a text that finds the row, whether it needs GPUs, the pieces it quotes in the order the row quotes them, each with
# the installed file that says it, a pattern under site-packages: one of its matches must say it). A piece is one string of torch's source: torch builds a message from several
# (c10::str(...), or two Python literals), so the message is checked piece by piece, and the row must hold the pieces
# in torch's order.
QUOTED = [
    ("Watchdog caught collective operation timeout", True, [
        ("[PG ID ", "torch/lib/libtorch_cuda.so"),  # ProcessGroupNCCL::createLogPrefix
        (" PG GUID ", "torch/lib/libtorch_cuda.so"),
        (") Rank ", "torch/lib/libtorch_cuda.so"),
        ("Watchdog caught collective operation timeout: ", "torch/lib/libtorch_cuda.so"),  # WorkNCCL::checkTimeout
        ("WorkNCCL(", "torch/lib/libtorch_cuda.so"),  # operator<<(ostream&, const WorkNCCL&)
        ("SeqNum=", "torch/lib/libtorch_cuda.so"),
        (", OpType=", "torch/lib/libtorch_cuda.so"),
        (", NumelIn=", "torch/lib/libtorch_cuda.so"),
        (", NumelOut=", "torch/lib/libtorch_cuda.so"),
        (", Timeout(ms)=", "torch/lib/libtorch_cuda.so"),
        (" ran for ", "torch/lib/libtorch_cuda.so"),
        (" milliseconds before timing out.", "torch/lib/libtorch_cuda.so"),
        ("To avoid data inconsistency, we are taking the entire process down.", "torch/lib/libtorch_cuda.so"),
        ("TORCH_FR_BUFFER_SIZE", "torch/lib/libtorch_*.so"),  # the fix's switches: torch's names for them
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "torch/lib/libtorch_*.so"),
        ("TORCH_FR_DUMP_TEMP_FILE", "torch/lib/libtorch_*.so"),
    ]),
    ("NCCL INFO Bootstrap: Using", True, [  # NCCL's log lines (bootstrap.cc, net_socket.cc, net_ib/init.cc)
        ("Bootstrap: Using", "nvidia/*/lib/libnccl.so*"),
        ("NET/Socket : Using", "nvidia/*/lib/libnccl.so*"),
        ("NET/IB : Using", "nvidia/*/lib/libnccl.so*"),
        ("NCCL_DEBUG_SUBSYS", "nvidia/*/lib/libnccl.so*"),  # the fix's variables: NCCL's names for them
        ("NCCL_SOCKET_IFNAME", "nvidia/*/lib/libnccl.so*"),
        ("NCCL_P2P_DISABLE", "nvidia/*/lib/libnccl.so*"),
        ("NCCL_IB_DISABLE", "nvidia/*/lib/libnccl.so*"),
    ]),
    ("invalid device ordinal", True, [
        ("AcceleratorError", "torch/cuda/__init__.py"),
        ("CUDA error: invalid device ordinal", "torch/testing/_internal/distributed/nn/api/remote_module_test.py"),
        ("invalid device ordinal", "nvidia/*/lib/libcudart.so*"),  # cudaGetErrorString
        ("GPU device may be out of range", "torch/lib/libc10_cuda.so"),  # c10::cuda::get_cuda_error_help
    ]),
    ("Multiple Ranks are using the same GPU", True, [
        ("NCCL error in: ", "torch/lib/libtorch_cuda.so"),  # C10D_NCCL_CHECK
        ("invalid usage (run with NCCL_DEBUG=WARN for details)", "nvidia/*/lib/libnccl.so*"),  # ncclGetErrorString
        ("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", "torch/lib/libtorch_cuda.so"),
        ("Last error:", "torch/lib/libtorch_cuda.so"),  # getNcclErrorDetailStr, then ncclGetLastError()
        ("Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this "
         "configuration.", "nvidia/*/lib/libnccl.so*"),  # init.cc, NCCL 2.30
    ]),
    ("CUDA out of memory. Tried to allocate", True, [
        ("OutOfMemoryError", "torch/cuda/__init__.py"),
        ("CUDA out of memory. Tried to allocate ", "torch/lib/libc10_cuda.so"),  # CUDACachingAllocator.cpp
        (". GPU ", "torch/lib/libc10_cuda.so"),
        (" has a total capacity of ", "torch/lib/libc10_cuda.so"),
    ]),
    ("Default process group has not been initialized", False, [
        ("Default process group has not been initialized, ", "torch/distributed/distributed_c10d.py"),
        ("please make sure to call init_process_group.", "torch/distributed/distributed_c10d.py"),
    ]),
    ("sampler option is mutually exclusive with shuffle", False, [
        ("sampler option is mutually exclusive with shuffle", "torch/utils/data/dataloader.py"),
    ]),
    ("Number of microbatches (", False, [  # Schedule1F1B.__init__: one f-string, cut by a backslash line break
        ("Number of microbatches (", "torch/distributed/pipelining/schedules.py"),
        (") must be greater than ", "torch/distributed/pipelining/schedules.py"),
        ("or equal to the number of stages (", "torch/distributed/pipelining/schedules.py"),
    ]),
    ("does not have a sharding strategy registered", False, [  # raised in lesson 15c, on the CPU
        ("Operator ", "torch/distributed/tensor/_sharding_prop.py"),
        (" does not have a sharding strategy registered.", "torch/distributed/tensor/_sharding_prop.py"),
    ]),
    ("Load balancing requires", True, [  # context_parallel() on GPUs
        ("Load balancing requires `is_causal=True`.", "torch/distributed/tensor/experimental/_context_parallel/*.py"),
        ("enable_load_balance", "torch/distributed/tensor/experimental/_context_parallel/*.py"),
    ]),
    ("Offsets have to be int32", False, [("Offsets have to be int32", "torch/lib/libtorch_cpu.so")]),
    ("strides should be multiple of 16 bytes", False, [
        ("strides should be multiple of 16 bytes", "torch/lib/libtorch_cpu.so")]),
    ("Expected to have finished reduction", False, [  # reducer.cpp
        ("Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
         "that your module has parameters that were not used in producing loss.", "torch/lib/libtorch_cpu.so"),
        ("Parameter indices which did not receive grad for rank ", "torch/lib/libtorch_cpu.so"),
        ("Parameters which did not receive grad for rank ", "torch/lib/libtorch_cpu.so"),
    ]),
]


def row_with(text: str) -> str:
    found = [line for line in (ROOT / "CHEATSHEET.md").read_text().splitlines()
             if line.startswith("|") and text in line]
    assert len(found) == 1, f"CHEATSHEET.md: {len(found)} rows with {text!r}, expected 1"
    return found[0]


def installed(pattern: str) -> list[Path]:
    return sorted(SITE_PACKAGES.glob(pattern))


@cache
def _mapped(path: Path) -> mmap.mmap:
    with path.open("rb") as file:  # the map outlives the file object; the libraries are 0.5 GB, so not read in
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


def says(path: Path, piece: str | bytes) -> bool:
    """The file holds these bytes: what `strings` would show, without its minimum length or its line breaks."""
    return _mapped(path).find(piece.encode() if isinstance(piece, str) else piece) != -1


@pytest.mark.parametrize("key, needs_gpus, pieces", QUOTED, ids=[key for key, _, _ in QUOTED])
def test_the_row_quotes_what_the_installed_torch_says(key, needs_gpus, pieces):
    row = row_with(key)
    cause_and_fix = "|".join(row.split("|")[2:4])
    assert (GPU_ONLY in cause_and_fix) == needs_gpus, \
        f"the row {'must' if needs_gpus else 'must not'} say {GPU_ONLY})' in its cause or fix: {row[:80]}"
    at = -1
    for piece, where in pieces:
        found = row.find(piece, at + 1)
        assert found > at, f"the row does not quote {piece!r} (after the pieces before it): {row[:80]}"
        at = found
    for piece, where in pieces:
        paths = installed(where)
        if not paths:  # a CPU-only torch has no CUDA libraries: nothing to read the words from
            pytest.skip(f"{where} is not installed here: cannot check the row's words against it")
        assert any(says(path, piece) for path in paths), \
            f"{where} no longer says {piece!r}: the cheat-sheet's row needs rewording"


def test_the_installed_nccl_is_the_one_whose_words_the_row_quotes():
    """The row quotes NCCL 2.30's wording and gives the older one as 'NCCL before 2.30'."""
    if not (nccl := installed("nvidia/*/lib/libnccl.so*")):
        pytest.skip("no NCCL installed with this torch")
    assert torch.cuda.nccl.version() >= (2, 30)
    assert not any(says(path, "Duplicate GPU detected") for path in nccl)


# The CPU ones, raised.

DEFAULT_GROUP = "Default process group has not been initialized, please make sure to call init_process_group."
SAMPLER_AND_SHUFFLE = "sampler option is mutually exclusive with shuffle"


def test_get_rank_before_init_process_group_raises_the_quoted_error():
    assert f"`ValueError: {DEFAULT_GROUP}`" in row_with(DEFAULT_GROUP)
    assert not dist.is_initialized(), "a process group is already open in this pytest process"
    with pytest.raises(ValueError) as error:
        dist.get_rank()
    assert DEFAULT_GROUP in str(error.value)
    # The control, the row's fix: ask after init_process_group. "fake" is torch's backend for tests: a real group
    # without gloo's threads in the pytest process.
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (1, 2)
    finally:
        dist.destroy_process_group()


def test_a_loader_with_a_sampler_and_shuffle_raises_the_quoted_error():
    assert f"`ValueError: {SAMPLER_AND_SHUFFLE}`" in row_with(SAMPLER_AND_SHUFFLE)
    data = TensorDataset(torch.arange(8))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
    with pytest.raises(ValueError) as error:
        DataLoader(data, batch_size=2, sampler=sampler, shuffle=True)
    assert SAMPLER_AND_SHUFFLE in str(error.value)
    # The control, the row's fix: no shuffle= on the loader; the sampler shuffles, and this rank gets its half.
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    seen = [i for (batch,) in loader for i in batch.tolist()]
    assert sorted(seen) == sorted(sampler) and len(seen) == 4
    assert seen != list(range(0, 8, 2)), "the sampler did not shuffle (rank 0 unshuffled takes 0, 2, 4, 6)"


def test_fewer_micro_batches_than_stages_raises_the_quoted_error():
    """Row "Number of microbatches": torch's Schedule1F1B refuses M < N when it is made, on any device ("fake": a
    real 2-rank group in this one process, stage 0 of 2); the control, the row's fix, M = N."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.testing._internal.distributed.fake_pg import FakeStore
    quoted = re.search(r"`ValueError: (Number of microbatches [^`]*)`", row_with("Number of microbatches (")).group(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        stage = PipelineStage(torch.nn.Linear(4, 4), 0, 2, torch.device("cpu"))
        with pytest.raises(ValueError) as error:
            Schedule1F1B(stage, 1)
        assert str(error.value) == quoted.replace("(3)", "(1)").replace("(4)", "(2)"), error.value
        assert type(Schedule1F1B(stage, 2)).__name__ == "Schedule1F1B"
    finally:
        dist.destroy_process_group()


UNUSED_PARAMETERS = '''\
"""Row "Expected to have finished reduction": a parameter forward() does not use, in DDP, with and without
find_unused_parameters=True (the control runs first). Run with TORCH_DISTRIBUTED_DEBUG=INFO."""
import sys

sys.path.insert(0, sys.argv[1])  # the course's ddp_scripts/

import ddp_common  # noqa: E402  before init_process_group
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class SpareHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 1)
        self.spare_head = nn.Linear(4, 1)  # never called in forward

    def forward(self, x):
        return self.used(x)


def two_steps(model):
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
two_steps(DDP(SpareHead(), find_unused_parameters=True))
if rank == 0:
    print("control: 2 steps with find_unused_parameters=True", flush=True)
try:
    two_steps(DDP(SpareHead()))
except RuntimeError as error:
    # Printed here, then a barrier: torchrun stops the other rank at the first failure, maybe before it printed.
    print(f"rank {rank}: RuntimeError: {error}", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1)
print("no error without find_unused_parameters=True", flush=True)
dist.destroy_process_group()
'''


def test_an_unused_parameter_raises_the_quoted_error_naming_it(launch_env, tmp_path):
    row = row_with("Expected to have finished reduction")
    quoted = [q for q in re.findall(r"`([^`]+)`", row) if "receive grad" in q or "finished reduction" in q]
    assert len(quoted) == 3, quoted  # the error, the indices, and the names TORCH_DISTRIBUTED_DEBUG=INFO adds
    script = tmp_path / "unused_parameter.py"
    script.write_text(UNUSED_PARAMETERS)
    with pytest.raises(lessons.LaunchError) as failure:
        lessons.torchrun(script, nproc=2, args=[str(SCRIPTS)], env={**launch_env, "TORCH_DISTRIBUTED_DEBUG": "INFO"},
                         show=False, timeout=120)
    rank0 = failure.value.result.outputs[0]
    assert "control: 2 steps with find_unused_parameters=True" in rank0
    for message in quoted:
        assert message in rank0, f"rank 0 did not say {message!r}:\n{rank0[-2000:]}"
    assert "no error without" not in rank0


def test_grouped_mm_raises_the_quoted_errors_and_the_rows_fixes_run():
    """Lesson 15d's two grouped-GEMM rows: int64 offsets, and 12-byte rows; each fix beside its error."""
    counts = torch.tensor([3, 0, 5, 2])
    rows, weights, offs = torch.randn(10, 8), torch.randn(4, 8, 16), counts.cumsum(0)
    with pytest.raises(RuntimeError, match="^Offsets have to be int32$"):
        torch.nn.functional.grouped_mm(rows, weights, offs=offs)
    with pytest.raises(RuntimeError, match="^strides should be multiple of 16 bytes$"):
        torch.nn.functional.grouped_mm(rows[:, :3].contiguous(), weights[:, :3], offs=offs.to(torch.int32))
    for width in (8, 4):  # the fixes: int32 offsets; a row of 4 float32 values is 16 bytes
        out = torch.nn.functional.grouped_mm(rows[:, :width].contiguous(), weights[:, :width],
                                             offs=offs.to(torch.int32))
        assert out.shape == (10, 16)
