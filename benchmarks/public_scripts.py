"""The DDP doctor on public training scripts, as TESTING.md asks of a tool: right on code nobody here wrote.

    .venv/bin/python benchmarks/public_scripts.py SOURCES_DIR [--only NAME] [--python PYTHON]

For each script below: its repository, commit and path; the edits that run it on 2 CPU ranks with tiny data (a
patch in benchmarks/public_scripts/, applied with `patch -p1`; only device, backend and sizes change; none where its
own flags suffice); what a
reviewer saw by reading it. SOURCES_DIR holds each repository at its commit, as SOURCES_DIR/owner+name/ (for
example `git clone https://github.com/pytorch/examples SOURCES_DIR/pytorch+examples` and `git checkout COMMIT`):
nothing is downloaded here, and no source is kept in this repository (their licences and sizes). Each script runs
in a fresh temporary copy of its folder: plainly under torchrun, then under the doctor, then with --compare; the
table's row says what the doctor found, its exit status, --compare's verdict and the seconds plain and doctored.
A benchmark, not a test: the seconds vary with the machine's load. The results go to benchmarks/LOG.md.

Some scripts need packages the course does not install ("needs"); give --python a Python that has them and sees the
course, for example a venv whose .pth line is `import site; site.addsitedir(".venv/lib/python3.X/site-packages")`
(absolute) with `uv pip install --no-deps timm huggingface_hub==0.26.5 safetensors pyyaml jsonargparse
docstring-parser typeshed-client transformers==4.46.3 tokenizers==0.20.3 regex openai==0.28.1 click yacs
termcolor tqdm six opencv-python-headless einops webdataset==0.2.86 braceexpand ftfy wcwidth pandas
python-dateutil pytz tzdata fsspec` and `uv pip install wandb==0.19.1` (with its dependencies) in it, and run this
file with that Python too (a tiny GPT-2 is made with its transformers). Data
is never downloaded: "prepare" writes tiny stand-ins where the script looks for its files (MNIST's raw files, a folder of
images, ImageNet's train/val folders, token ids, a model and its tokenizer), so the script's own download code finds
them present and skips the download. "fresh" names the folders a script resumes from, removed before each run;
"nodes" adds a run with `-n 1 --nodes 2` (mistakes that show from the second node on);
"doctor" gives the doctor flags of its own (a --timeout where a script is known to hang it). A source missing from
SOURCES_DIR is a row that says so. Extract one at its commit from a clone with `git archive COMMIT | tar -x -C
SOURCES_DIR/owner+name` (a mirror without some large files: `git archive COMMIT -- PATHS`, the paths whose objects
it has).
"""
import argparse
import contextlib
import gzip
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "benchmarks" / "public_scripts"
SCRIPTS = [
    {"name": "pytorch/examples imagenet/main.py", "repo": "pytorch/examples",
     "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "path": "imagenet/main.py",
     "patch": "pytorch+examples__imagenet.patch",
     "args": ["--dummy", "-b", "8", "--epochs", "1", "-j", "0", "--dist-backend", "gloo", "--dist-url", "env://"],
     "read": "no DDP on the CPU (separate models); a save on every rank without --multiprocessing-distributed; no"
             " destroy_process_group; mp.spawn only under --multiprocessing-distributed"},
    {"name": "pytorch/examples distributed/FSDP2/example.py", "repo": "pytorch/examples",
     "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "path": "distributed/FSDP2/example.py",
     "patch": "pytorch+examples__FSDP2.patch", "args": [],
     "read": "every rank draws the same random batch (one seed, torch.randint in the loop): no data parallelism,"
             " which no DataLoader shows; a device from LOCAL_RANK (right); a checkpoint through its own class"},
    {"name": "Lightning-AI/pytorch-lightning examples/pytorch/basics/backbone_image_classifier.py",
     "repo": "Lightning-AI/pytorch-lightning", "commit": "7f0c3436cd3f6ad3753125672024fc415cbcb414",
     "path": "examples/pytorch/basics/backbone_image_classifier.py",
     "patch": "Lightning-AI+pytorch-lightning__backbone_image_classifier.patch",
     "args": ["--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.max_epochs=1",
              "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
              "--trainer.limit_predict_batches=2", "--data.batch_size=8"],
     "needs": ["lightning", "jsonargparse", "docstring_parser", "typeshed_client"],
     "prepare": ["mnist", "data"],
     "read": "every rank downloads MNIST in the DataModule's __init__ (not prepare_data): a race on a first"
             " download; val/test/train epoch losses logged without sync_dist (rank 0's only); test and predict"
             " on a DistributedSampler (padded duplicates), predictions printed per rank, not gathered; Lightning"
             " does the sampler, set_epoch, DDP, rank-0 checkpoint"},
    {"name": "Lightning-AI/pytorch-lightning examples/fabric/image_classifier/train_fabric.py",
     "repo": "Lightning-AI/pytorch-lightning", "commit": "7f0c3436cd3f6ad3753125672024fc415cbcb414",
     "path": "examples/fabric/image_classifier/train_fabric.py",
     "patch": "Lightning-AI+pytorch-lightning__train_fabric.patch",
     "args": ["--epochs", "1", "--batch-size", "16"],
     "needs": ["lightning", "torchmetrics"],
     "prepare": ["mnist", "../../../Datasets"],
     "read": "seed_everything(1) alike on every rank and the model has dropout: the same dropout masks on every"
             " rank; print on every rank; otherwise right: setup_dataloaders shards (set_epoch by Fabric),"
             " rank_zero_first download, torchmetrics syncs, fabric.save on rank 0"},
    {"name": "huggingface/accelerate examples/cv_example.py", "repo": "huggingface/accelerate",
     "commit": "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83", "path": "examples/cv_example.py",
     "patch": "huggingface+accelerate__cv_example.patch", "args": ["--data_dir", "pets", "--cpu"],
     "needs": ["timm", "accelerate"],
     "prepare": ["images", "pets", {"classes": 4, "per_class": 8, "size": 64, "name": "{c}_{i}.jpg",
                                    "by_class": False}],
     "read": "none of consequence: Accelerate shards the loaders, seeds its sampler per epoch, all-reduces"
             " through DDP and de-duplicates the evaluation (gather_for_metrics); one seed on every rank"
             " (set_seed(42)) gives the ranks' DataLoader workers the same seeds: the same random crops on every"
             " rank (minor); the process group is destroyed by end_training()"},
    {"name": "facebookresearch/dino main_dino.py", "repo": "facebookresearch/dino",
     "commit": "7c446df5b9f45747937fb0d72314eb9f7b66930a", "path": "main_dino.py", "folder": ".",
     "patch": "facebookresearch+dino__main_dino.patch",
     "args": ["--arch", "vit_tiny", "--out_dim", "256", "--local_crops_number", "2", "--batch_size_per_gpu", "2",
              "--epochs", "1", "--warmup_epochs", "0", "--use_fp16", "false", "--num_workers", "1",
              "--data_path", "images", "--output_dir", "out"],
     "fresh": ["out"],
     "prepare": ["images", "images", {"classes": 2, "per_class": 8, "size": 64}],
     "read": "one seed on every rank (utils.fix_random_seeds(args.seed), no rank): the student's DropPath"
             " masks are the same on every rank, and so are the DataLoader workers' seeds (the same crops, flips,"
             " jitter, blur on every rank); no destroy_process_group; a non-finite loss exits one rank alone"
             " (sys.exit in the loop: the others hang); saves on rank 0 only (right); set_epoch (right)"},
    {"name": "olehb/pytorch_ddp_tutorial ddp_tutorial_multi_gpu.py", "repo": "olehb/pytorch_ddp_tutorial",
     "commit": "dee224b0085669d97cbc8394f1537817edc83dfc", "path": "ddp_tutorial_multi_gpu.py",
     "patch": "olehb+pytorch_ddp_tutorial__multi_gpu.patch", "args": [], "prepare": ["mnist", "mnist_data"],
     "nodes": True,
     "read": "the sampler's rank is LOCAL_RANK and its num_replicas the GPUs of one node: on 2 nodes both nodes"
             " train the same shards; MNIST downloaded on every rank at once; every rank evaluates the whole"
             " test set and prints its own unreduced losses; a save on LOCAL_RANK 0 (one per node); no"
             " destroy_process_group"},
    {"name": "seba-1511/dist_tuto.pth train_dist.py", "repo": "seba-1511/dist_tuto.pth",
     "commit": "a552567061a9985cdcfe72ecb9b47e4630d6a7fe", "path": "train_dist.py",
     "patch": "seba-1511+dist_tuto.pth__train_dist.patch", "args": [], "prepare": ["mnist", "data"],
     "read": "its own average_gradients all-reduces only `if type(param) is torch.Tensor`, never true of an"
             " nn.Parameter: no gradient is ever reduced, each rank trains its own model on its own shard;"
             " the same seed on every rank (the same dropout masks); it starts its own ranks with Process and"
             " sets MASTER_PORT=29500 over torchrun's; epoch_loss += loss keeps every step's graph; no"
             " destroy_process_group"},
    {"name": "karpathy/nanoGPT train.py", "repo": "karpathy/nanoGPT",
     "commit": "3adf61e154c3fe3fca428ad6bc3818b27a3b8291", "path": "train.py", "folder": ".",
     "patch": "karpathy+nanoGPT__train.patch",
     "args": ["--device=cpu", "--backend=gloo", "--compile=False", "--dtype=float32", "--dataset=tiny",
              "--batch_size=4", "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=32",
              "--gradient_accumulation_steps=2", "--max_iters=6", "--lr_decay_iters=6", "--eval_interval=3",
              "--eval_iters=2", "--log_interval=1", "--out_dir=out"],
     "fresh": ["out"], "prepare": ["tokens", "data/tiny"],
     "read": "no DataLoader: each rank draws its batches at random from a memmap (get_batch), with a seed per rank"
             " (1337 + rank) set before the model (DDP broadcasts rank 0's weights); no_sync through"
             " require_backward_grad_sync; evaluation and checkpoints on rank 0 only; destroys the group: nothing"
             " to find"},
    {"name": "tatsu-lab/stanford_alpaca train.py (Hugging Face Trainer)", "repo": "tatsu-lab/stanford_alpaca",
     "commit": "761dc5bfbdeeffa89b8bff5d038781a4055f796a", "path": "train.py", "folder": ".",
     "patch": None, "needs": ["transformers", "openai"],
     "args": ["--model_name_or_path", "tiny", "--data_path", "data.json", "--output_dir", "out",
              "--num_train_epochs", "1", "--per_device_train_batch_size", "4", "--model_max_length", "256",
              "--use_cpu", "--report_to", "none", "--save_strategy", "no", "--ddp_backend", "gloo"],
     "fresh": ["out"], "prepare": ["tiny_gpt2", "."],
     "read": "transformers 4.x (it passes Trainer(tokenizer=...), gone in 5.x). The Trainer seeds every rank with"
             " one seed (set_seed(42)) and GPT-2 has dropout: the same dropout masks on every rank"
             " (huggingface/transformers#31412); the Trainer shards the data (Accelerate's batch_sampler), saves on"
             " rank 0 and all-reduces through DDP"},
    {"name": "narumiruna/pytorch-distributed-example mnist/main.py", "repo": "narumiruna/pytorch-distributed-example",
     "commit": "f031e0bf548272e522a39f33ec5d6cefad0e6653", "path": "mnist/main.py",
     "patch": "narumiruna+pytorch-distributed-example__mnist.patch",
     "args": ["--backend", "gloo", "-i", "env://", "--epochs", "2", "--batch-size", "16"],
     "prepare": ["mnist", "data"],
     "read": "no DDP: its own average_gradients all-reduces each p.grad and divides by the world size after"
             " backward (right; one seed everywhere gives the same start); no sampler.set_epoch: every epoch the"
             " same order; MNIST downloaded on every rank; every rank evaluates the whole test set and prints"
             " its own metrics; no destroy_process_group"},
    {'name': 'NVlabs/edm train.py (InfiniteSampler)',
     'repo': 'NVlabs/edm',
     'commit': '008a4e5316c8e3bfe61a62f874bddba254295afb',
     'path': 'train.py',
     'folder': '.',
     'patch': 'NVlabs+edm__train.patch',
     'args': ['--outdir=out',
              '--data=data',
              '--arch=ddpmpp',
              '--cbase=8',
              '--cres=1',
              '--batch=64',
              '--batch-gpu=32',
              '--duration=0.001',
              '--tick=1',
              '--snap=1',
              '--dump=1',
              '--seed=0',
              '--workers=1',
              '--bench=False',
              '--lr=10'],
     'needs': ['click', 'psutil'],
     'fresh': ['out'],
     'prepare': ['images', 'data', {'classes': 2, 'per_class': 8, 'size': 8}],
     'read': 'its own sampler (torch_utils/misc.py InfiniteSampler): one shuffled order from the same seed on every '
             'rank, position idx to rank idx % num_replicas, endless (no __len__, no set_epoch needed): disjoint '
             'shares (right); a seed per rank (seed * world + rank) for the noise, augmentation and dropout, DDP '
             "broadcasts rank 0's weights; accumulation under no_sync (misc.ddp_sync); snapshots and state on rank 0 "
             'only; no destroy_process_group. --lr=10: the lr ramps up over 10 Mimg (lr_rampup_kimg, no flag), so a '
             "1 kimg run peaks at 1e-3, EDM's own lr. The patch also drops Sampler.__init__(dataset) (gone in torch "
             '2.x)'},
    {'name': 'tczhangzhi/pytorch-distributed distributed.py',
     'repo': 'tczhangzhi/pytorch-distributed',
     'commit': 'cd12856420858b14e02873e7d5c8cc7bb5aab5b0',
     'path': 'distributed.py',
     'patch': 'tczhangzhi+pytorch-distributed__distributed.patch',
     'args': ['--data', 'data', '-a', 'resnet18', '--epochs', '1', '-b', '16', '-p', '1'],
     'prepare': ['train_val',
                 'data',
                 {'train': {'classes': 4, 'per_class': 8, 'size': 40},
                  'val': {'classes': 3, 'per_class': 3, 'size': 40}}],
     'read': "its world size is torch.cuda.device_count() (args.nprocs: the per-rank batch and reduce_mean's "
             "divisor; right on one node only) and its rank --local_rank (torch.distributed.launch's); the "
             'validation runs on a DistributedSampler (padded shards: 9 images on 2 ranks count one twice) and '
             "averages each batch's accuracy with reduce_mean; a save on local_rank 0 (one per node); set_epoch "
             "(right); no destroy_process_group; ResNet's BatchNorm statistics per rank (no SyncBN). The patch also "
             "takes --local_rank's default from LOCAL_RANK (torchrun passes no --local_rank), device_count from "
             'LOCAL_WORLD_SIZE, and .view(-1) -> .reshape(-1) in accuracy() (newer torch)'},
    {'name': 'microsoft/Swin-Transformer main.py (auto-resume)',
     'repo': 'microsoft/Swin-Transformer',
     'commit': 'f82860bfb5225915aca09c3227159ee9e1df874d',
     'path': 'main.py',
     'folder': '.',
     'patch': 'microsoft+Swin-Transformer__main.patch',
     'needs': ['timm', 'yacs', 'termcolor'],
     'args': ['--cfg',
              'configs/swin/swin_tiny_patch4_window7_224.yaml',
              '--data-path',
              'imagenet',
              '--batch-size',
              '4',
              '--accumulation-steps',
              '2',
              '--output',
              'out',
              '--tag',
              'tiny',
              '--opts',
              'DATA.IMG_SIZE',
              '32',
              'DATA.NUM_WORKERS',
              '0',
              'MODEL.SWIN.EMBED_DIM',
              '16',
              'MODEL.SWIN.DEPTHS',
              '[1,1]',
              'MODEL.SWIN.NUM_HEADS',
              '[1,2]',
              'MODEL.SWIN.WINDOW_SIZE',
              '4',
              'TRAIN.EPOCHS',
              '2',
              'TRAIN.WARMUP_EPOCHS',
              '0',
              'TRAIN.LR_SCHEDULER.NAME',
              'linear',
              'TRAIN.BASE_LR',
              '0.5',
              'PRINT_FREQ',
              '1'],
     'fresh': ['out'],
     'prepare': ['train_val',
                 'imagenet',
                 {'train': {'classes': 2, 'per_class': 16, 'size': 32},
                  'val': {'classes': 1, 'per_class': 7, 'size': 32}}],
     'read': 'resumes without being asked (TRAIN.AUTO_RESUME on by default): each rank lists the output folder '
             'itself and takes the newest *.pth (one shared folder on one node: the ranks agree; a folder per node '
             "would not); the checkpoint pickles the yacs config, which torch.load's default weights_only=True "
             "(torch >= 2.6) refuses, so a resume crashes on today's torch. A seed per rank (SEED + rank: drop-path, "
             "Mixup/CutMix and RandAugment differ per rank; DDP broadcasts rank 0's weights), DistributedSampler "
             "with set_epoch, saves on rank 0, map_location='cpu': right. Validation on a DistributedSampler (7 "
             'images on 2 ranks: one padded duplicate), all-reduced; gradient accumulation without no_sync (an '
             'all-reduce per micro-batch: a waste, not wrong); no destroy_process_group'},
    {'name': 'rasbt/LLMs-from-scratch appendix-A DDP-script-torchrun.py',
     'repo': 'rasbt/LLMs-from-scratch',
     'commit': '28c65cdfbc3338e2e040016eea4b7fdf556e4d57',
     'path': 'appendix-A/01_main-chapter-code/DDP-script-torchrun.py',
     'patch': 'rasbt+LLMs-from-scratch__DDP-script-torchrun.patch',
     'args': [],
     'nodes': True,
     'read': 'the global rank given to init_process_group is LOCAL_RANK when set (always under torchrun): on 2 nodes '
             "two processes claim rank 0; the training accuracy is each rank's own shard of the train loader "
             '(DistributedSampler), printed per rank and never all-reduced; every rank evaluates the whole test set '
             '(duplicated work, right); one seed on every rank but no dropout; set_epoch and destroy_process_group '
             '(right). 5 samples on 2 ranks pad one, which drop_last then drops'},
    {'name': 'nauyan/PyTorch-Distributed-Tutorials train_fsdp.py (FSDP1)',
     'repo': 'nauyan/PyTorch-Distributed-Tutorials',
     'commit': 'cfbbbf88176177dde86bfe9b3e9c76812913460e',
     'path': 'train_fsdp.py',
     'patch': 'nauyan+PyTorch-Distributed-Tutorials__train_fsdp.patch',
     'args': [],
     'needs': ['timm', 'tqdm'],
     'read': 'FullyShardedDataParallel (FSDP1, FULL_SHARD, size-based auto-wrap) on a timm ResNet; a shuffling '
             'DistributedSampler and no set_epoch: every epoch the same order; no destroy_process_group. No seed at '
             "all: torch seeds each process's CPU generator at random, so every rank (and every run) draws its own "
             "initial weights (pretrained=True: only the new 10-class head; the patch's pretrained=False: all), and "
             "FSDP1's sync_module_states is off (no broadcast): harmless under FULL_SHARD, where each rank keeps "
             'only its own shard of each flat parameter (one consistent, mixed init), not so under NO_SHARD; no '
             "dropout. FSDP1 neither syncs nor broadcasts buffers: each rank's BatchNorm running statistics are its "
             'own (never evaluated or saved here: harmless); CIFAR10 downloaded on every rank at once (the patch '
             "puts FakeData of CIFAR10's shape in its place: torchvision checks CIFAR's md5s, so no stand-in file "
             'can pass); tqdm on every rank; no checkpoint, no evaluation'},
    {'name': 'Rose-STL-Lab/nautilus_tutorial mnist_ddp.py',
     'repo': 'Rose-STL-Lab/nautilus_tutorial',
     'commit': '3f0fa9ffc24300dff482988d626f855a41bf7bae',
     'path': 'mnist_ddp.py',
     'patch': 'Rose-STL-Lab+nautilus_tutorial__mnist_ddp.patch',
     'args': ['--batch-size', '16', '--test-batch-size', '32', '--epochs', '2', '--log-interval', '4'],
     'prepare': ['mnist', 'data'],
     'read': 'one seed on every rank (torch.manual_seed(args.seed) after init) and the Net has dropout: the same '
             'dropout masks on every rank; no destroy_process_group. Right: DistributedSampler with set_epoch, rank '
             '0 downloads MNIST first behind a barrier, evaluation on rank 0 alone over the whole test set '
             '(model.module; the others wait at a barrier), a save on rank 0 only (--save-model, off), the device '
             'from LOCAL_RANK'},
    {"name": "Edward-RSE/torch-multip main.py (torch.multiprocessing.Process, Hogwild)",
     "repo": "Edward-RSE/torch-multip",
     "doctor": ["--timeout", "90"],
     "commit": "3b43719c4747cf3fe11cc68058ae3a96c4860d01", "path": "main.py", "patch": None,
     "args": ["--world-size", "2", "--num-epochs", "1", "--batch-size", "32"], "prepare": ["mnist", "data"],
     "read": "PyTorch's MNIST Hogwild pattern: main() seeds one seed, makes the Net in shared memory and starts"
             " --world-size torch.multiprocessing.Process (spawn), each running SGD on that shared model over the"
             " whole data set (no sampler, no process group: lock-free updates), then validates on the training"
             " set. Under torchrun each rank does all of this alone: no process ever calls init_process_group, so"
             " 2 ranks are 2 copies of one Hogwild job (the same seed: the same model twice); MNIST downloaded on"
             " every rank"},
    {"name": "Edward-RSE/torch-multip main.py --multinode (its torchrun variant)", "repo": "Edward-RSE/torch-multip",
     "doctor": ["--timeout", "90"],
     "commit": "3b43719c4747cf3fe11cc68058ae3a96c4860d01", "path": "main.py", "patch": None,
     "args": ["--multinode", "--num-epochs", "2", "--batch-size", "16"], "prepare": ["mnist", "data"],
     "nodes": True,
     "read": "the same tutorial's distributed path: each torchrun rank starts one child with"
             " torch.multiprocessing.spawn(nprocs=1), which passes LOCAL_RANK as init_process_group's rank (right"
             " on one node; on 2 nodes two processes claim rank 0) and WORLD_SIZE from torchrun; DDP, a"
             " DistributedSampler with set_epoch, a seed per rank (seed + rank) before training: the Net's dropout"
             " differs per rank (right), DDP broadcasts rank 0's weights; rank 0 saves and validates on the whole"
             " training set alone, between barriers; destroys the group"},
    {"name": "lufficc/SSD train.py (its own DistributedSampler in a batch_sampler)", "repo": "lufficc/SSD",
     "commit": "68dc0a20efaf3997e58b616afaaaa21bf8ca3c05", "path": "train.py", "patch": "lufficc+SSD__train.patch",
     "args": ["--config-file", "configs/mobilenet_v2_ssd320_voc0712.yaml", "--use_tensorboard", "False", "--skip-test",
              "--log_step", "1", "--save_step", "100", "--eval_step", "-1", "MODEL.DEVICE", "cpu",
              "MODEL.BACKBONE.PRETRAINED", "False", "DATA_LOADER.NUM_WORKERS", "2", "SOLVER.BATCH_SIZE", "4",
              "SOLVER.MAX_ITER", "12", "SOLVER.LR_STEPS", "[8, 10]", "DATASETS.TRAIN", "('voc_2007_trainval',)",
              "OUTPUT_DIR", "out"],
     "needs": ["yacs", "cv2"], "fresh": ["out"], "prepare": ["voc", "datasets/VOC2007", {"images": 16}],
     "read": "its own DistributedSampler (ssd/data/samplers: a copy of torch's, padded, shuffled by its epoch) in a"
             " BatchSampler, wrapped in an IterationBasedBatchSampler that calls set_epoch(iteration) at each pass"
             " (right), given to the DataLoader as batch_sampler= with DATA_LOADER.NUM_WORKERS workers: disjoint"
             " shares; DDP; no seed (each rank its own init, DDP broadcasts rank 0's; each rank's workers their own"
             " augmentation); the lr scaled by the world size and MAX_ITER and the milestones divided by it (one"
             " process trains twice the iterations at half the rate); the losses reduced to rank 0 for logging"
             " (dist.reduce each step); checkpoints on rank 0 only, and every rank resumes from OUTPUT_DIR's last one"
             " (CheckPointer.load, map_location cpu) without being asked; no destroy_process_group; MobileNetV2's"
             " BatchNorm per rank. The final VOC evaluation (gathers the predictions by image id) is skipped"
             " (--skip-test: its np.bool fails on NumPy 2). The patch: gloo, no set_device, DDP without device_ids,"
             " and a numeric torchvision version check (its string compare '0.29.1' >= '0.3.0' exits)"},
    {"name": "meta-math/MetaMath train_math.py (Hugging Face Trainer, dataloader workers)",
     "repo": "meta-math/MetaMath",
     "commit": "fe667b14f9a4c51bde9809adafb82b6b5d255800", "path": "train_math.py", "patch": None,
     "needs": ["transformers"],
     "args": ["--model_name_or_path", "tiny", "--data_path", "data.json", "--data_length", "32", "--output_dir", "out",
              "--num_train_epochs", "1", "--per_device_train_batch_size", "4", "--model_max_length", "256",
              "--use_cpu", "--report_to", "none", "--save_strategy", "no", "--ddp_backend", "gloo",
              "--dataloader_num_workers", "2"],
     "fresh": ["out"], "prepare": ["tiny_gpt2", "."],
     "read": "Stanford Alpaca's train.py, modified: its collator tokenizes in the DataLoader's workers"
             " (--dataloader_num_workers 2); random.seed(42) at import shuffles the examples alike on every rank"
             " (one order, then sharded by the Trainer: right); the Trainer seeds every rank with one seed (42) and"
             " GPT-2 has dropout: the same dropout masks on every rank; the Trainer shards the data (Accelerate's"
             " batch_sampler), all-reduces through DDP and saves on rank 0 (should_save); transformers 4.x"},
    {"name": "qiuqiangkong/mini_llm train_accelerate.py (Accelerate, an endless sampler)",
     "repo": "qiuqiangkong/mini_llm", "commit": "9282d30d62eaa155b4f597ff9e29c8d9ebb07899",
     "path": "train_accelerate.py", "patch": "qiuqiangkong+mini_llm__train_accelerate.patch",
     "args": ["--model_name", "Llama", "--no_log"], "needs": ["wandb", "einops"], "fresh": ["checkpoints"],
     "read": "Accelerate prepares a DataLoader with num_workers workers over its own endless sampler (MySampler:"
             " random.randint(0, 1), so the loader draws only the indices 0 and 1); the data set ignores the index"
             " and cuts a random window of the text with Python's random in each worker, seeded from each rank's"
             " own (unseeded) torch generator: every rank draws its own windows, by design (as nanoGPT's get_batch"
             " does), though every rank's loader draws the same indices; no seed (DDP broadcasts rank 0's init);"
             " evaluation and checkpoints on the main process only, over the unsharded text (right); no"
             " end_training or destroy_process_group; no dropout. The patch: the CPU (and Accelerator(cpu=True):"
             " without it Accelerate runs each rank as a process of its own on a machine without GPUs), a 2-layer"
             " width-32 Llama, 6 steps, 2 workers, windows of 32"},
    {"name": "mlfoundations/open_clip open_clip_train/main.py --fsdp (FSDP2, a 1-element logit_scale)",
     "repo": "mlfoundations/open_clip", "commit": "89fb801f1e6087880e951fc8354b8a2077b79c6d",
     "path": "src/open_clip_train/main.py", "folder": "src", "patch": "mlfoundations+open_clip__main.patch",
     "args": ["--model", "ViT-tiny-cpu", "--dataset-type", "synthetic", "--train-num-samples", "32",
              "--batch-size", "4", "--epochs", "1", "--workers", "1", "--device", "cpu", "--precision", "fp32",
              "--fsdp", "--lr", "1e-3", "--warmup", "1", "--save-frequency", "1", "--report-to", "none",
              "--log-every-n-steps", "1"],
     "needs": ["webdataset", "pandas", "ftfy", "braceexpand", "regex"], "fresh": ["logs"],
     "read": "FSDP2 (--fsdp): prepare_fsdp reshapes the 0-D logit_scale to [1] and fully_shard()s the blocks and"
             " the root, so on 2 ranks rank 1's shard of logit_scale is empty; one seed for the init"
             " (random_seed(seed, 0)), then a seed per rank; a DistributedSampler with set_epoch (DataInfo); the"
             " contrastive loss gathers every rank's features; the full checkpoint is gathered by every rank and"
             " written by rank 0 only; no destroy_process_group; no dropout. Its synthetic data set repeats one"
             " image and one caption: the loss stays at log 8 and only the weight decay moves the weights. The"
             " patch puts src/ on sys.path (as `pip install -e .` would) and adds a tiny model config"},
    {"name": "haofanwang/pytorch-distributed-training main.py", "repo": "haofanwang/pytorch-distributed-training",
     "commit": "8fab8bd72fcdb4ccdc086e9fbec3922fa9dcc845", "path": "main.py",
     "patch": "haofanwang+pytorch-distributed-training__main.patch", "args": ["--epochs", "2", "--batch_size", "64"],
     "read": "evaluate() runs each rank over its own half of the validation set (a DistributedSampler) and puts"
             " (correct, total) in a tensor that it never all-reduces: rank 0 prints its own half's accuracy (the"
             " next epoch's dist.reduce of the training loss, for logging, comes after it); a shuffling"
             " DistributedSampler and no set_epoch over 2 epochs: the same order twice; one seed on every rank"
             " (the same data, the same init; no dropout); no destroy_process_group; SyncBatchNorm conversion of a"
             " model without BatchNorm (nothing). The patch: gloo, no .cuda()"},
    {"name": "zjykzj/pytorch-distributed multi_gpu/main.py (torchmetrics over padded shards)",
     "repo": "zjykzj/pytorch-distributed", "commit": "5e83d929e2cac6303227a8920c0b8ba713aeb88f",
     "path": "multi_gpu/main.py", "patch": "zjykzj+pytorch-distributed__multi_gpu.patch",
     "args": ["--batch-size", "16", "--test-batch-size", "16", "-e", "2", "--log-interval", "4"],
     "prepare": ["mnist", "data", {"test": 63}],
     "read": "its rank is --local_rank (torch.distributed.launch's), passed to init_process_group: on 2 nodes two"
             " processes claim rank 0; a seed per rank before the model (DDP broadcasts rank 0's); a shuffling"
             " DistributedSampler and no set_epoch over 2 epochs: the same order twice; the test pass runs on a"
             " padded DistributedSampler (63 images on 2 ranks: one counted twice) and torchmetrics'"
             " Accuracy.compute() sums the ranks' counts (gathered): the duplicate is counted; MNIST downloaded on"
             " every rank; no destroy_process_group; BatchNorm per rank. The patch: gloo, the CPU, --local_rank's"
             " default from LOCAL_RANK, Accuracy(task='multiclass', num_classes=10) (required since torchmetrics"
             " 0.11)"},
    {"name": "BigChungusDaddy/DistributedPyTorch: Lei Mao's ResNet-18 DDP example (train_dist)",
     "repo": "BigChungusDaddy/DistributedPyTorch",
     "commit": "4709b41797806670a92cf6797d1545077900e11e", "path": "train_dist.py",
     "patch": "BigChungusDaddy+DistributedPyTorch__train_dist.patch",
     "args": ["--num_epochs", "2", "--batch_size", "16", "--model_dir", "."],
     "read": "Lei Mao's ResNet-18 DDP example, edited for the CPU and gloo: torch.save of the state dict on every"
             " rank at epoch 0, to one path; a shuffling DistributedSampler and no set_epoch over 2 epochs: the"
             " same order twice; one seed on every rank (the same init, no dropout; the same worker seeds, so the"
             " same random crops and flips on every rank); every rank evaluates the whole test set (duplicated"
             " work, right); no destroy_process_group; BatchNorm per rank. The patch puts FakeData of CIFAR10's"
             " shape in place of CIFAR10 (torchvision checks its md5s: no stand-in file can pass) and 2 workers"},
    {"name": "chaochen1998/Pytorch-distributed-training-demo demo.py",
     "repo": "chaochen1998/Pytorch-distributed-training-demo", "commit": "70aa9d9d3d8aa42a5f02728fb846295f972b67ec",
     "path": "demo.py", "patch": "chaochen1998+Pytorch-distributed-training-demo__demo.patch", "args": [],
     "read": "the GPU picked by the global rank (torch.cuda.set_device(rank % device_count()): right on one node"
             " only), the device by LOCAL_RANK; CIFAR10 downloaded by global rank 0 only while the others wait at"
             " a barrier (on 2 nodes the second node's copy is missing); a DistributedSampler with set_epoch"
             " (right); no seed (DDP broadcasts rank 0's init); rank 0 prints its own shard's training accuracy;"
             " rank 0 saves; no destroy_process_group; random crops in 4 workers; BatchNorm per rank. The patch:"
             " gloo and the CPU (set_device kept behind torch.cuda.is_available()), FakeData for CIFAR10 (md5s),"
             " batch 16, 2 epochs, 2 workers"},
]


def fake_mnist(root: Path, train: int = 256, test: int = 64) -> None:
    """MNIST's four raw files, as torchvision reads them (idx format), with random digits: download=True then finds
    them and downloads nothing."""
    import numpy as np
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    for split, count in (("train", train), ("t10k", test)):
        images = generator.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = generator.integers(0, 10, size=count, dtype=np.uint8)
        for kind, array, header in (("images-idx3", images, struct.pack(">IIII", 2051, count, 28, 28)),
                                    ("labels-idx1", labels, struct.pack(">II", 2049, count))):
            data = header + array.tobytes()
            (raw / f"{split}-{kind}-ubyte").write_bytes(data)
            (raw / f"{split}-{kind}-ubyte.gz").write_bytes(gzip.compress(data))


def image_folder(root: Path, classes: int = 4, per_class: int = 8, size: int = 64, name: str = "{i}.png",
                 by_class: bool = True) -> None:
    """A folder of small random images: root/class_c/0.png... (ImageFolder's layout), or all in root when not
    by_class; name is a format of c (the class) and i."""
    import numpy as np
    from PIL import Image
    generator = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c}" if by_class else root
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = generator.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / name.format(c=c, i=i))


def train_val_folders(root: Path, train: dict | None = None, val: dict | None = None) -> None:
    """ImageNet's layout, as torchvision's ImageFolder reads it: ROOT/train/class_c/i.png and ROOT/val/class_c/i.png
    (image_folder's options for each)."""
    image_folder(root / "train", **(train or {}))
    image_folder(root / "val", **(val or {}))


def token_bins(root: Path, vocab: int = 65, tokens: int = 4096) -> None:
    """nanoGPT's prepared data set: train.bin and val.bin (uint16 token ids) and meta.pkl (the vocabulary's size)."""
    import pickle

    import numpy as np
    root.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    for split in ("train", "val"):
        generator.integers(0, vocab, size=tokens, dtype=np.uint16).tofile(root / f"{split}.bin")
    (root / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": vocab}))


def tiny_gpt2(root: Path, examples: int = 32) -> None:
    """A causal language model to fine-tune, made here (no download): a 2-layer GPT-2 of width 32 with dropout 0.1
    (GPT-2's default), a byte-level GPT-2 tokenizer with no merges (vocab.json, merges.txt), and an instruction data
    set in Alpaca's format (ROOT/data.json). Made by this Python, which must have transformers (see --python)."""
    import json
    made = subprocess.run([sys.executable, "-c", (
        "import sys, transformers; c = transformers.GPT2Config(vocab_size=257, n_positions=256, n_embd=32, n_layer=2,"
        " n_head=2, bos_token_id=256, eos_token_id=256); transformers.GPT2LMHeadModel(c).save_pretrained(sys.argv[1])"
    ), str(root / "tiny")], capture_output=True, text=True)
    if made.returncode:
        raise RuntimeError(made.stderr.strip().splitlines()[-1])
    # GPT-2's byte-to-unicode table: every byte a printable character, so every byte is a token
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte], extra = chr(256 + extra), extra + 1
    vocab = {chars[b]: b for b in range(256)} | {"<|endoftext|>": 256}
    (root / "tiny" / "vocab.json").write_text(json.dumps(vocab))
    (root / "tiny" / "merges.txt").write_text("#version: 0.2\n")
    (root / "tiny" / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": 256}))
    tasks = [{"instruction": f"Add {a} and {b}.", "input": "", "output": str(a + b)} for a in range(4)
             for b in range(examples // 4)]
    (root / "data.json").write_text(json.dumps(tasks))


def voc_folder(root: Path, images: int = 16, size: int = 96, splits: tuple = ("trainval", "test")) -> None:
    """Pascal VOC's layout, as detection code reads it: ROOT/JPEGImages/ID.jpg, ROOT/Annotations/ID.xml (one or two
    objects of a VOC class, a box inside the image, not difficult) and ROOT/ImageSets/Main/SPLIT.txt (every id)."""
    import numpy as np
    from PIL import Image
    classes = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")
    generator = np.random.default_rng(0)
    for folder in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    ids = [f"{i:06d}" for i in range(images)]
    for image_id in ids:
        Image.fromarray(generator.integers(0, 256, size=(size, size, 3), dtype=np.uint8)).save(
            root / "JPEGImages" / f"{image_id}.jpg")
        objects = []
        for _ in range(int(generator.integers(1, 3))):
            x1, y1 = (int(v) for v in generator.integers(1, size // 2, size=2))
            x2, y2 = (int(v) for v in generator.integers(size // 2 + 8, size, size=2))
            objects.append(f"<object><name>{classes[int(generator.integers(0, len(classes)))]}</name>"
                           f"<difficult>0</difficult><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax>"
                           f"<ymax>{y2}</ymax></bndbox></object>")
        (root / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><size><width>{size}</width><height>{size}</height><depth>3</depth></size>"
            + "".join(objects) + "</annotation>")
    for split in splits:
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")


PREPARE = {"mnist": fake_mnist, "images": image_folder, "train_val": train_val_folders, "tokens": token_bins,
           "tiny_gpt2": tiny_gpt2, "voc": voc_folder}
# a script's "prepare": [kind, folder, {options}]


def run(command, cwd):
    started = time.monotonic()
    done = subprocess.run([str(c) for c in command], cwd=cwd, text=True, capture_output=True, timeout=900)
    return done, time.monotonic() - started


def has_module(python: Path, name: str) -> bool:
    return subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode == 0


@contextlib.contextmanager
def prepared_copy(script: dict, sources: Path, python: Path, keep: Path | None = None):
    """Yields (folder, script name, None) in a patched copy of the script's folder with its stand-in data, or (None,
    None, why not) when it can't be run here."""
    repo_dir = sources / script["repo"].replace("/", "+")
    if not (repo_dir / script["path"]).is_file():
        yield None, None, f"not in {repo_dir}"
        return
    missing = [name for name in script.get("needs", []) if not has_module(python, name)]
    if missing:
        yield None, None, f"needs {', '.join(missing)}: see --python"
        return
    keep = Path(keep, script["repo"].replace("/", "+")) if keep else None
    if keep:
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
    with (contextlib.nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory()) as work:
        folder = Path(script.get("folder", Path(script["path"]).parent))
        shutil.copytree(repo_dir / folder, Path(work) / folder, dirs_exist_ok=True)  # "folder": "." too
        patched = subprocess.run(["patch", "-p1", "-i", PATCHES / script["patch"]], cwd=work, text=True,
                                 capture_output=True) if script["patch"] else None  # runs on the CPU as it is
        if patched is not None and patched.returncode:
            yield None, None, f"the patch did not apply: {patched.stdout.strip()[:80]}"
            return
        here = Path(work) / Path(script["path"]).parent
        if "prepare" in script:
            kind, data_folder, *options = script["prepare"]
            PREPARE[kind](here / data_folder, **(options[0] if options else {}))
        yield here, Path(script["path"]).name, None


def examine(script: dict, sources: Path, python: Path, show: bool = False,
            keep: Path | None = None) -> list[str]:
    """One row: the findings' codes (notes marked), the exit status, --compare's verdict, the seconds plain and
    doctored."""
    with prepared_copy(script, sources, python, keep) as (here, name, why):
        if why:
            return [script["name"], "-", "-", why, "-"]

        def fresh():  # a script that resumes from what it wrote ("fresh": its output folders) starts from nothing
            for path in script.get("fresh", []):
                shutil.rmtree(here / path, ignore_errors=True)
        flags = script.get("doctor", [])  # the doctor's own flags (a --timeout for a script that hangs it)
        runs = {"plain": [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", name],
                "doctored": [python, "-m", "lessons", "doctor", name, "-n", "2", *flags, "--"],
                "--compare": [python, "-m", "lessons", "doctor", name, "-n", "2", "--compare", *flags, "--"]}
        if script.get("nodes"):  # mistakes that show only from the second node on
            runs["2 nodes"] = [python, "-m", "lessons", "doctor", name, "-n", "1", "--nodes", "2", *flags, "--"]
        done, seconds = {}, {}
        for title, command in runs.items():
            fresh()
            done[title], seconds[title] = run([*command, *script["args"]], here)
    if show:
        for title, result in done.items():
            print(f"--- {script['name']}: {title}, exit {result.returncode}\n{result.stdout[-6000:]}"
                  f"{result.stderr[-6000:]}")

    def codes(result):
        found = []
        for line in result.stdout.splitlines():
            note = line.startswith("note: ")
            code = line.removeprefix("note: ").split(":", 1)[0]
            if re.fullmatch(r"[a-z]+(-[a-z]+)+", code):
                found.append(f"{code} (note)" if note else code)
        return ", ".join(found) or "no findings"
    compare_lines = [line.removeprefix("compare: ") for line in done["--compare"].stdout.splitlines()
                     if line.startswith("compare: ")]
    verdict = next((line for line in compare_lines if line.startswith(("no comparison", "2 ranks and one"))), "-")
    found = codes(done["doctored"]) + (f"; with 2 nodes: {codes(done['2 nodes'])}" if "2 nodes" in done else "")
    return [script["name"], found, f"{done['doctored'].returncode} (plain {done['plain'].returncode})",
            verdict[:110], f"{seconds['plain']:.1f} / {seconds['doctored']:.1f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", type=Path, help="the repositories, as SOURCES/owner+name/ at their commits")
    parser.add_argument("--only", help="one script, by a part of its name")
    parser.add_argument("--python", type=Path, default=ROOT / ".venv" / "bin" / "python",
                        help="the Python that runs the scripts and the doctor (default: the course's)")
    parser.add_argument("--show", action="store_true", help="print each run's output too (to make a patch)")
    parser.add_argument("--keep", type=Path, help="leave each patched copy in KEEP/owner+name/ (to time it again)")
    options = parser.parse_args()
    print("| script (commit) | read before running | found | exit | --compare | seconds, plain / doctored |")
    print("|---|---|---|---|---|---|")
    for script in SCRIPTS:
        if options.only and options.only not in script["name"]:
            continue
        name, found, status, compare, seconds = examine(script, options.sources, options.python, options.show,
                                                        options.keep)
        print(f"| {name} ({script['commit'][:7]}) | {script['read']} | {found} | {status} | {compare} | {seconds} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
