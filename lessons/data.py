"""Offline image data that a DataLoader must really decode: PNG files written from scikit-learn's digits."""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset


def write_png_digits(directory: str | Path, count: int = 600, size: int = 160) -> Path:
    """Write `count` digit images as size x size RGB PNG files named INDEX_LABEL.png; return the directory."""
    import torch.nn.functional as F
    from PIL import Image
    from sklearn.datasets import load_digits

    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
    for i in range(count):
        j = i % len(images)
        pixels = (images[j, 0] * 255).round().to(torch.uint8).numpy()
        Image.fromarray(pixels, mode="L").convert("RGB").save(directory / f"{i:05d}_{data.target[j]}.png")
    return directory


class PngDigits(Dataset):
    """Reads, decodes and augments one PNG per item: the work that num_workers spreads over processes."""

    def __init__(self, directory: str | Path, train: bool = True):
        import torchvision.transforms as T

        self.files = sorted(Path(directory).glob("*.png"))
        if not self.files:
            raise FileNotFoundError(f"no .png files in {directory}")
        augment = [T.RandomResizedCrop(128, scale=(0.6, 1.0)), T.RandomHorizontalFlip()] if train else [T.CenterCrop(128)]
        self.transform = T.Compose([*augment, T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)])

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        from PIL import Image

        path = self.files[index]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), int(path.stem.split("_")[1])


def loader_throughput(dataset: Dataset, num_workers: int, batch_size: int = 32, pin_memory: bool = False,
                      threads: int | None = None) -> dict:
    """Images per second in steady state, and what came out (to check nothing was lost).

    Two passes over `dataset` with persistent workers; only the second is timed, so the workers' start-up
    (a new process each, importing torch) is not counted. `threads` sets torch's intra-op threads for the
    main process during the measurement."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        pin_memory=pin_memory, persistent_workers=num_workers > 0)
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        for _ in loader:  # warm-up pass: starts the workers
            pass
        start = time.perf_counter()
        labels = []
        for images, batch_labels in loader:
            labels.extend(batch_labels.tolist())
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(saved_threads)
    return {"num_workers": num_workers, "threads": torch.get_num_threads() if not threads else threads,
            "images_per_s": len(labels) / seconds, "labels": labels}
