"""Loaded by every pytest run from the top of the repository, whatever the paths given (a notebook alone too)."""
import os

# nbval compares the notebooks' printed floats and parameter hashes bit for bit, and torch's CPU kernels give other
# bits on other instruction sets: ATen's vectorised sums (AVX-512 against AVX2), oneDNN's convolutions and MKL's GEMMs
# each pick a code path by CPU. The same notebook gave other digits on two machines of this workplace. So every process
# of a test run (the kernels and the ranks inherit it) uses the AVX2 paths, which every x86 machine here has; the
# committed outputs were made the same way (TESTING.md). Learners' runs are not pinned.
CPU_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
for _name, _value in CPU_PINS.items():
    os.environ.setdefault(_name, _value)

# Two pytest workers keep both cores busy, and an OpenMP thread that waits for its partner spins by default: a
# 2-thread training loop in a kernel took 2.4 s and 3.1 CPU-s with the other core busy, 1.3 s and 1.2 CPU-s with
# passive waiting (benchmarks/omp_wait_policy.py). Passive waiting changes no result, only who burns the CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
