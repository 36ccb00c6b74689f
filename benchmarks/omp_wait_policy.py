"""Benchmark: OpenMP's wait policy for a 2-thread torch training loop, with one core busy elsewhere (as under
`make test`, two workers on two cores) and without. Prints wall and CPU seconds and their ratios.

    python benchmarks/omp_wait_policy.py
"""
import os
import subprocess
import sys
import time

LOOP = """
import time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(14400, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(150):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
print(time.perf_counter() - wall, time.process_time() - cpu)
"""


def measure(policy: str | None) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # None: libgomp's default
    env.update(OMP_NUM_THREADS="2", **({"OMP_WAIT_POLICY": policy} if policy else {}))
    out = subprocess.run([sys.executable, "-c", LOOP], env=env, capture_output=True, text=True, check=True).stdout
    wall, cpu = map(float, out.split())
    return wall, cpu


def main():
    for busy in (False, True):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(0.5)
            default, passive = measure(None), measure("PASSIVE")
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        print(f"{'one core busy' if busy else 'idle':>13}: default {default[0]:.2f} s wall, {default[1]:.2f} CPU-s; "
              f"PASSIVE {passive[0]:.2f} s, {passive[1]:.2f} CPU-s; PASSIVE/default wall {passive[0] / default[0]:.2f}, "
              f"CPU {passive[1] / default[1]:.2f}")


if __name__ == "__main__":
    main()
