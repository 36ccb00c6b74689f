"""Execute notebooks the way the tests run them, and write their outputs back.

    make execute NB=notebooks/08_syncbatchnorm.ipynb    # one notebook
    make execute                                        # every notebook, in course order

As `make test` runs them: the CPU pins of conftest.py (the committed outputs are made with them), the notebook's
scratch paths deleted first (so it makes what it reads), the cells nbval skips (GPU-only cells, exercise checks)
left as they are, and cells tagged nbval-raises-exception allowed to raise. One notebook at a time, so a timing is
the notebook's own; no execution timestamps are written (and any old ones are dropped), so a re-run of an unchanged
lesson changes only the outputs that really vary. Timings vary with the machine's load: regenerate a notebook whose
printed timings you mean to quote on a quiet machine.
"""
import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from conftest import clear_scratch  # noqa: E402  (importing it also sets the CPU pins in os.environ)

CELL_TIMEOUT_S = 900  # nbval's --nbval-cell-timeout (pyproject.toml)


def strip_timestamps(notebook) -> None:
    """Drop the `execution` timestamps that Jupyter writes into each cell's metadata."""
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)


def tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def execute(path: Path) -> None:
    import asyncio

    import nbformat
    from jupyter_core.utils import ensure_async
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    clear_scratch(path)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})

    async def run():  # nbclient's own execute(), but skipping what nbval skips
        async with client.async_setup_kernel():
            info = await client.async_wait_for_reply(await ensure_async(client.kc.kernel_info()))
            notebook.metadata["language_info"] = info["content"]["language_info"]
            count = 0
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                count += 1  # every code cell counts, skipped or not, as in a run of the whole notebook
                if "nbval-skip" in tags(cell):
                    continue
                expected_error = "nbval-raises-exception" in tags(cell)
                if expected_error:  # nbclient's own tag for "this cell raises", for this run only
                    cell.metadata["tags"] = tags(cell) + ["raises-exception"]
                try:
                    await client.async_execute_cell(cell, index, execution_count=count)
                finally:
                    if expected_error:
                        cell.metadata["tags"].remove("raises-exception")
            client.set_widgets_metadata()

    asyncio.run(run())
    strip_timestamps(notebook)
    nbformat.write(notebook, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook, in course order")
    parser.add_argument("--strip-only", action="store_true", help="only drop the execution timestamps")
    options = parser.parse_args(argv)
    paths = options.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))  # 00 ... 15, then the appendix 99
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"execute: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    for path in paths:
        if options.strip_only:
            import nbformat
            notebook = nbformat.read(path, as_version=4)
            strip_timestamps(notebook)
            nbformat.write(notebook, path)
            continue
        started = time.monotonic()
        print(f"{path.name} ...", end=" ", flush=True)
        execute(path.resolve())
        print(f"{time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
