"""The DDP doctor's instruments (lessons/tools/doctor.py), loaded into every rank by Python itself.

The doctor puts this directory first on the ranks' PYTHONPATH, so Python imports this file at start-up, before the
script. It records what the rank does into LESSONS_DOCTOR_DIR/rank<R>.jsonl, one JSON event per line, written as it
happens (a rank that hangs and is killed has still written what it did); lessons/tools/doctor_events.py describes every
event. Every event names the script's line that caused it ("site": the first frame outside torch and this file). It
is inert in torchrun's agent (no RANK), without LESSONS_DOCTOR_DIR, and in any process a rank starts (DataLoader
workers, compile workers).

It must not change the run it watches: every callable it replaces keeps the original's signature, name and
attributes (functools.wraps), because libraries read them (Lightning rebuilds a DataLoader from the parameters of
DataLoader.__init__'s signature). The installers are split by area as the rules are, in the package beside this file
(_ddp_doctor_instruments: recorder and the end, data, the group and the model, files); this file loads them.

What it records, and why (lessons/tools/doctor_rules.py and its areas turn it into findings):
- samplers and loaders as they are made (the data set's fingerprint, num_replicas, rank, the batch size), and each
  pass over a loader with the indices it drew: which ranks trained on which samples, at which epoch;
- optimizer steps, counted in every batch event: a pass during which the optimizer stepped is a *training* pass
  (an evaluation pass, or an extra next(iter(loader)), is not);
- the script's own collectives (not torch's internal ones), saves, loads (with where the file's tensors were saved
  from), init_process_group's rank, DDP/FSDP wrappers, mp.spawn;
- at exit, every optimizer's parameters (and each DDP module's), to compare between ranks and with one process.
"""
import os
import sys


def _install(out_dir, rank):
    import torch
    # Not an instrument: the course's teardown fix (ddp_scripts/ddp_common.py, appendix section 5), so that a
    # script's rare abort at exit (a gloo thread meeting Python's shutdown) never fails the doctor's launch. Imported
    # here, before the script's init_process_group; the garbage is collected at exit.
    import torch.distributed.nn  # noqa: F401
    from _ddp_doctor_instruments import data, files, group, recorder

    rec = recorder._Recorder(out_dir, rank)
    rec.event("start", rank=rank, pid=os.getpid(), torch=torch.__version__)
    for install in (data.install_data, group.install_optimizers, group.install_wrappers, group.install_process_group,
                    files.install_files, data.install_arguments, recorder.install_exit):
        install(rec)


def _activate():
    out_dir = os.environ.get("LESSONS_DOCTOR_DIR")
    if not out_dir or "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return  # not the doctor's launch, or torchrun's agent
    owner = os.environ.get("LESSONS_DOCTOR_RANK_PID")
    # The one process a rank spawned to do its work (mp.spawn(nprocs=1)): the rank, from now on. Not the resource
    # tracker multiprocessing starts beside it, which inherits the same environment.
    follow = owner and os.environ.pop("LESSONS_DOCTOR_FOLLOW", None) == owner \
        and any("spawn_main" in argument for argument in getattr(sys, "orig_argv", []))
    if owner and owner != str(os.getpid()) and not follow:  # a process the rank started: the environment, not the job
        try:
            __import__("_ddp_doctor_instruments.group").group.watch_a_spawned_process(out_dir, int(os.environ["RANK"]))
        except Exception:  # noqa: BLE001  never why a process fails
            pass
        return
    os.environ["LESSONS_DOCTOR_RANK_PID"] = str(os.getpid())
    try:
        _install(out_dir, int(os.environ["RANK"]))
    except Exception as error:  # the instruments must never be why a script fails
        with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.error"), "w") as f:
            f.write(f"{type(error).__name__}: {error}\n")


_activate()
