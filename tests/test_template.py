"""ddp_scripts/template.py: it trains at 1, 2 and 3 ranks, resumes exactly, 2 ranks x 2 micro-batches x B/4 equal
1 x B (the epoch's last, shorter group and the clip included), the doctor finds nothing in it, and --amp, --compile
and --workers run. Six launches in all, each checked for several things (lesson 14 runs it once more)."""
import lessons
from conftest import SCRIPTS

TEMPLATE = SCRIPTS / "template.py"


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def test_template_one_process_resumes_exactly_and_matches_two_ranks_with_half_the_batch(tmp_path, launch_env):
    # Two epochs of a three-epoch schedule (the learning rate follows --epochs), as a job with a time limit runs.
    # Batch 40: 37 steps of 40 and a last one of 20 an epoch; the clip is on in every run.
    straight = lessons.run_python(TEMPLATE, ["--epochs", "3", "--stop-after", "2", "--batch-size", "40", "--clip", "1"],
                                  show=False, env=launch_env)
    checkpoint = str(tmp_path / "one.pt")
    one_epoch = ["--epochs", "3", "--stop-after", "1", "--batch-size", "40", "--clip", "1", "--checkpoint", checkpoint]
    lessons.run_python(TEMPLATE, one_epoch, show=False, env=launch_env)
    resumed = lessons.run_python(TEMPLATE, one_epoch, show=False, env=launch_env)
    assert f"resumed from {checkpoint} at epoch 1" in resumed.stdout[-1]  # lines without "rank N" go under -1
    # Resumed: the same model, optimizer (momentum), scheduler and data order as a run that never stopped.
    assert resumed.result["weight_sums"] == straight.result["weight_sums"]
    assert resumed.result["epoch_losses"] == straight.result["epoch_losses"][1:]
    assert straight.result["epoch_losses"][1] < straight.result["epoch_losses"][0]
    assert straight.result["test_samples"] == 297 and straight.result["test_acc"] > 0.85

    # 2 ranks x 2 micro-batches of 10, through the doctor: the same global batches (the last group one micro-batch,
    # its loss divided by 1, not 2), clipped after the all-reduce, so the same weights; and no finding.
    report = lessons.doctor(TEMPLATE, nproc=2, args=["--epochs", "3", "--stop-after", "2", "--batch-size", "10",
                                                     "--accumulate", "2", "--clip", "1",
                                                     "--checkpoint", str(tmp_path / "two.pt")], env=launch_env)
    assert (report.status, report.codes, report.error) == (0, [], None), str(report)
    two = report.launch.result
    assert two["world_size"] == 2 and two["test_samples"] == 297
    assert close(two["weight_sums"], straight.result["weight_sums"]), (two, straight.result)
    assert close(two["epoch_losses"], straight.result["epoch_losses"])

    # 3 ranks resume the 2-rank checkpoint (map_location onto their own device) and train a third epoch, with the
    # other flags: bf16 autocast (the checkpoint's scaler state is empty), a compiler backend that needs no C
    # compiler, a DataLoader worker per rank.
    three = lessons.torchrun(TEMPLATE, nproc=3, args=["--epochs", "3", "--batch-size", "10", "--amp", "--compile",
                                                      "aot_eager", "--workers", "1",
                                                      "--checkpoint", str(tmp_path / "two.pt")],
                             show=False, env=launch_env)
    assert "at epoch 2" in three.stdout[0]
    assert three.result["world_size"] == 3 and three.result["test_samples"] == 297
    assert len(three.result["epoch_losses"]) == 1
    assert three.result["epoch_losses"][0] < two["epoch_losses"][-1] and three.result["test_acc"] > 0.9


def test_template_is_self_contained_and_short():
    text = TEMPLATE.read_text()
    assert "ddp_common" not in text and "lessons" not in text.replace("lesson ", "")
    # 170 lines until its GPU rule (a function, tested with ddp_common's) and the evaluation's buffers (issue 52)
    assert len(text.splitlines()) <= 185
    for pattern in ("@record", "set_device", "device_id=", "timeout=", "set_epoch", "no_sync", "convert_sync_batchnorm",
                    "torch.autocast", "torch.compile", "map_location=device, weights_only=True", "os.replace",
                    "destroy_process_group"):
        assert pattern in text, pattern
