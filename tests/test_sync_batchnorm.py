"""Lesson 08's hand-made SyncBatchNorm at the sizes its notebook doesn't launch, and its bad input.

The notebook runs 2 ranks with 3,5 and 0,4 samples at BatchNorm's default momentum, and the training comparison."""
import sys

import pytest
from torch import nn

import lessons
from conftest import SCRIPTS

CHECKS = ("forward_matches", "input_grad_matches", "param_grad_matches", "running_stats_match",
          "num_batches_tracked_matches")


@pytest.mark.parametrize("nproc, size_lists, momentum", [  # 2 ranks at the default momentum 0.1: the notebook's
    (4, ["2,2,2,2", "1,0,3,2"], "none"),  # momentum=None: BatchNorm's cumulative average, read from the counter
])
def test_hand_made_syncbn_equals_batchnorm_on_the_whole_batch(nproc, size_lists, momentum, launch_env):
    result = lessons.torchrun(SCRIPTS / "sync_batchnorm.py", nproc=nproc,
                              args=["--batch-sizes", *size_lists, "--momentum", momentum],
                              env=launch_env, show=False).result
    assert result["world_size"] == nproc and result["momentum"] == (None if momentum == "none" else float(momentum))
    assert [c["batch_sizes"] for c in result["checks"]] == [[int(s) for s in sizes.split(",")] for sizes in size_lists]
    for checked in result["checks"]:
        assert all(checked[check] for check in CHECKS), checked["max_diff"]
        assert checked["per_rank_bn_matches"] is False  # the control: per-rank statistics are not the batch's
        assert checked["allreduces"] == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("sizes, message", [
    ("3,5,2", "--batch-sizes needs one size >= 0 per rank: 2 ranks, got '3,5,2'"),
    ("3,-1", "--batch-sizes needs one size >= 0 per rank: 2 ranks, got '3,-1'"),
    ("3,x", "--batch-sizes must be whole numbers separated by commas, got '3,x'"),
    ("0,0", "--batch-sizes are all 0: BatchNorm needs more than 1 value per channel when training"),
])
def test_bad_batch_sizes_are_one_line(sizes, message, monkeypatch):
    sys.path.insert(0, str(SCRIPTS))
    import sync_batchnorm

    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would set it; the checks come before any process group
    monkeypatch.setattr(sys, "argv", ["sync_batchnorm.py", "--batch-sizes", "2,2", sizes])
    with pytest.raises(SystemExit) as stopped:
        sync_batchnorm.main()
    assert str(stopped.value) == message


@pytest.mark.parametrize("batchnorm", [nn.BatchNorm2d(3, affine=False), nn.BatchNorm2d(3, track_running_stats=False)],
                         ids=["affine=False", "track_running_stats=False"])
def test_what_the_hand_made_layer_does_not_do_is_refused_in_one_line(batchnorm):
    sys.path.insert(0, str(SCRIPTS))
    from hand_syncbn import convert_to_hand_sync

    with pytest.raises(ValueError, match=r"^HandSyncBatchNorm2d needs affine=True and track_running_stats=True, got "
                                         rf"affine={batchnorm.affine}, track_running_stats={batchnorm.track_running_stats}$"):
        convert_to_hand_sync(nn.Sequential(nn.Conv2d(3, 3, 1), batchnorm))


def test_the_converter_keeps_values_and_mode_in_new_parameters():
    sys.path.insert(0, str(SCRIPTS))
    from hand_syncbn import HandSyncBatchNorm2d, convert_to_hand_sync

    batchnorm = nn.BatchNorm2d(3, eps=1e-3, momentum=None)
    nn.init.normal_(batchnorm.weight)
    batchnorm.running_mean.fill_(0.5)
    batchnorm.num_batches_tracked.fill_(7)
    batchnorm.eval()
    state = {name: tensor.clone() for name, tensor in batchnorm.state_dict().items()}
    converted = convert_to_hand_sync(nn.Sequential(batchnorm))[0]
    assert type(converted) is HandSyncBatchNorm2d and converted.eps == 1e-3 and converted.momentum is None
    assert converted.training is False and converted.weight is not batchnorm.weight
    assert all(tensor.equal(state[name]) for name, tensor in converted.state_dict().items())


EMPTY_RANK_LIKE_TORCH = '''
import json
import sys

sys.path.insert(0, {scripts!r})
import ddp_common  # before init_process_group
import torch.distributed as dist
from hand_syncbn import HandSyncBatchNorm2d, SyncBatchNormFunction
from sync_batchnorm import check, verdicts


class GradNoneWhenEmpty(HandSyncBatchNorm2d):
    """As torch's nn.SyncBatchNorm on a rank without samples (nn/modules/_functions.py): .grad stays None."""

    def forward(self, x):
        self.num_batches_tracked.add_(1)
        weight, bias = (self.weight.detach(), self.bias.detach()) if x.numel() == 0 else (self.weight, self.bias)
        return SyncBatchNormFunction.apply(x, weight, bias, self.running_mean, self.running_var, self.eps, self.momentum)


dist.init_process_group("gloo")
max_diff = check([0, 4], dist.get_rank(), ddp_common.backend_and_device()[1], synced_bn=GradNoneWhenEmpty)["max_diff"]
if dist.get_rank() == 0:
    print("RESULT " + json.dumps(verdicts(max_diff)))
dist.destroy_process_group()
'''


def test_the_check_takes_a_grad_left_none_on_an_empty_rank_as_zero(tmp_path, launch_env):
    """torch's nn.SyncBatchNorm (checked on GPUs only) leaves weight.grad None on a rank without samples; emulated."""
    script = tmp_path / "empty_rank_like_torch.py"
    script.write_text(EMPTY_RANK_LIKE_TORCH.format(scripts=str(SCRIPTS)))
    result = lessons.torchrun(script, nproc=2, env=launch_env, show=False).result
    assert all(result.values()), result
