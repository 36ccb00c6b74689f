"""train_ddp.py offline failure; the sampler explorer; the PNG loader (notebook 04 runs the training itself)."""
import pytest

import lessons
from conftest import SCRIPTS
from lessons.data import PngDigits, loader_throughput, write_png_digits
from lessons.sampler import sampler_explorer, shards


def test_cifar10_is_downloaded_once_per_file_system_and_offline_every_rank_stops_with_one_line(launch_env, tmp_path):
    """Two nodes that share --data-dir: global rank 0 alone downloads (one writer per file system, lesson 10b; each
    node's LOCAL_RANK 0 used to, two writers of one directory). Offline, every rank stops with one line."""
    dead_proxy = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", **launch_env}
    with pytest.raises(lessons.LaunchError) as failure:
        lessons.torchrun_nodes(SCRIPTS / "train_ddp.py", nnodes=2, nproc_per_node=1, env=dead_proxy, show=False,
                               args=["--dataset", "cifar10", "--data-dir", tmp_path], timeout=120)
    stderr = failure.value.result.stderr[0]
    assert stderr.startswith(f"rank 0 could not download CIFAR-10 to {tmp_path}"), stderr
    assert "rank 1" not in stderr, stderr  # node 1's LOCAL_RANK 0 left the shared directory alone
    assert "Traceback" not in stderr
    assert "use --dataset digits" in stderr


def test_the_offline_digits_are_scikit_learns_load_digits(monkeypatch):
    """train_ddp.py reads sklearn's digits file itself (importing sklearn costs a second per rank): same data."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    monkeypatch.syspath_prepend(str(SCRIPTS))
    import train_ddp

    train, test = train_ddp.digits(seed=0)
    data = load_digits()
    images = F.interpolate(torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0, size=32,
                           mode="bilinear", align_corners=False).expand(-1, 3, -1, -1)
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    for split, rows in ((train, order[:1500]), (test, order[1500:])):
        assert torch.equal(split.tensors[0], (images[rows] - 0.5) / 0.5)
        assert torch.equal(split.tensors[1], torch.tensor(data.target)[rows])


def test_sampler_padding_drop_last_and_set_epoch():
    assert shards(10, 4, shuffle=False) == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    assert shards(10, 4, shuffle=False, drop_last=True) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert shards(12, 2, epoch=1, set_epoch=False) == shards(12, 2, epoch=0)
    assert shards(12, 2, epoch=1) != shards(12, 2, epoch=0)
    assert sorted(i for r in shards(12, 3, epoch=2) for i in r) == list(range(12))
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        shards(10, 0)


def test_sampler_explorer_responds_to_its_controls():
    explorer = sampler_explorer(size=10, world_size=4)
    size, world, epoch = explorer.children[0].children
    shuffle, drop_last = explorer.children[1].children
    view = explorer.children[2]
    assert "Repeated (padding, underlined): [" in view.value
    world.value = 5  # 10 divides by 5: no padding
    assert "Repeated (padding, underlined): none" in view.value and "rank 4" in view.value
    drop_last.value, size.value = True, 7
    assert "Never seen (drop_last): [" in view.value


def test_png_loader_delivers_everything_with_and_without_workers(tmp_path):
    dataset = PngDigits(write_png_digits(tmp_path, count=40, size=140))
    image, label = dataset[3]
    assert tuple(image.shape) == (3, 128, 128) and 0 <= label <= 9
    serial, parallel = loader_throughput(dataset, 0, batch_size=8), loader_throughput(dataset, 2, batch_size=8)
    assert serial["labels"] == parallel["labels"] and len(serial["labels"]) == 40
    with pytest.raises(FileNotFoundError, match="no .png files"):
        PngDigits(tmp_path / "empty")
