"""lessons.torchrun: results, failures with their root cause, timeouts, interrupts, bad input."""
import os
import signal
import subprocess
import sys
import time

import pytest

import lessons
from lessons.tools.failure import root_cause_rank
from lessons.tools.rank_output import LaunchResult, as_terminal_shows
from conftest import FIXTURES, MARKER, SCRIPTS, processes_with


# A rank whose own code raised (its traceback first, the root cause, the other rank's output kept): lesson 00's
# crash_on_rank1.py cells, compared by nbval.


def test_rank_killed_by_a_signal_is_named(launch_env):
    with pytest.raises(lessons.LaunchError, match=r"^rank 0 of abort_rank0.py failed \(signal SIGABRT\)") as failure:
        lessons.torchrun(FIXTURES / "abort_rank0.py", nproc=2, env=launch_env, show=False)
    assert "ChildFailedError" not in str(failure.value)  # not torchrun's wall of text (it is in torchrun.log)
    assert "ChildFailedError" in failure.value.result.launcher_log  # the control: torchrun did say it


def test_timeout_stops_every_process(launch_env):
    """A timeout counted from the start: how many workers torchrun has started by then depends on the machine's
    load (test_workers_that_ignore_sigterm... counts them, from a line both print); none may be left."""
    start = time.monotonic()
    with pytest.raises(lessons.LaunchError, match=r"(?s)timed out after 4 s\. Where each rank was:.*Stopped torchrun and"):
        lessons.torchrun(FIXTURES / "hang.py", nproc=2, timeout=4, env=launch_env, show=False)
    assert time.monotonic() - start < 4 + 2 * lessons.tools.launch.STOP_GRACE_S + 5
    # launch_env's teardown checks that no process of the launch is left.


def test_workers_that_ignore_sigterm_are_killed_and_the_output_so_far_is_kept(launch_env, monkeypatch):
    """timeout_from: the clock starts once both ranks have printed their line, i.e. ignore SIGTERM already. One line
    per rank, as lesson 13b's hang gives it (rank 1's is part of the line both print): the message names each."""
    monkeypatch.setattr(lessons.tools.processes, "STOP_GRACE_S", 1)  # SIGTERM stops nothing here: no need to wait 5 s
    start = time.monotonic()
    with pytest.raises(lessons.LaunchError) as failure:
        lessons.torchrun(FIXTURES / "hang.py", nproc=2, args=["--ignore-sigterm"], timeout=1,
                         timeout_from={0: "hanging now", 1: "now"}, env=launch_env, show=False)
    assert str(failure.value).startswith(
        "hang.py timed out 1 s after every rank printed its start line (rank 0: 'hanging now', rank 1: 'now').")
    assert "Stopped torchrun and 2 worker process(es)." in str(failure.value)
    assert failure.value.result.outputs == {0: "hanging now\n", 1: "hanging now\n"}
    # SIGKILL after the grace period; nobody waits torchrun's 30 s.
    assert time.monotonic() - start < 30
    # launch_env's teardown checks that no process of the launch is left.


def test_timeout_from_counts_from_the_line_not_from_the_start(launch_env):
    """slow_start.py runs about 5 s (1 s of it after 'ready'); a 4 s timeout from 'ready' lets it finish. The
    timeout is the ranks': torchrun's own exit after them (seconds on a loaded machine: 1 failure in 10 under load
    when it counted) gets lessons.tools.processes.AGENT_EXIT_S more."""
    start = time.monotonic()
    run = lessons.torchrun(FIXTURES / "slow_start.py", nproc=2, timeout=4, timeout_from="ready", env=launch_env,
                           show=False)
    assert time.monotonic() - start > 4 + 1  # longer than the timeout: it counted from the line
    assert run.stdout == {0: "ready\ndone\n", 1: "ready\ndone\n"}


def test_a_start_line_that_never_comes_times_out_and_names_the_ranks(launch_env, monkeypatch):
    monkeypatch.setattr(lessons.tools.launch, "START_LIMIT_S", 4)
    with pytest.raises(lessons.LaunchError) as failure:
        lessons.torchrun(FIXTURES / "hang.py", nproc=2, timeout=1, timeout_from="a line nobody prints",
                         env=launch_env, show=False)
    assert str(failure.value).startswith(
        "hang.py timed out: not every rank printed 'a line nobody prints' within 4 s (ranks 0, 1 did not).")


def test_the_start_line_is_seen_per_attempt():
    """Two ranks of one attempt must both print it; rank 1 of a later attempt does not complete attempt_0."""
    from lessons.tools.live import StartLine
    start = StartLine("ready", nproc=2)
    start.see([("attempt_0", 0, "rank 0 ready"), ("attempt_0", 1, "starting")])
    start.see([("attempt_1", 1, "ready")])
    assert start.at is None and start.missing() == [1]
    start.see([("attempt_0", 1, "rank 1 ready now")])
    assert start.at is not None and start.missing() == []


def test_a_start_line_per_rank_starts_the_clock_at_the_event_one_rank_reports():
    """{rank: text}: rank 0 leaving a loop, the others at their start; a line meant for another rank counts not."""
    from lessons.tools.live import StartLine
    start = StartLine({0: "stopping alone", 1: "started", 2: "started"}, nproc=3)
    start.see([("attempt_0", 0, "started"), ("attempt_0", 1, "started"), ("attempt_0", 2, "stopping alone")])
    assert start.at is None and start.missing() == [0, 2]
    start.see([("attempt_0", 0, "step 120: stopping alone"), ("attempt_0", 2, "started")])
    assert start.at is not None
    assert start.wanted() == "its start line (rank 0: 'stopping alone', ranks 1, 2: 'started')"
    assert StartLine("ready", nproc=2).wanted() == "'ready'"


def test_a_line_held_back_in_jupyter_goes_out_at_a_later_tick_without_new_lines(monkeypatch):
    """The live view updates at most every 0.25 s; rank 1's first line, 0.1 s after rank 0's, must not wait for
    the next line a rank prints (it was shown only 4 s later, in the browser test's launch)."""
    from lessons.tools import live
    shown, now = [], [100.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: now[0])
    view = live.LiveOutput(jupyter=False)
    view.jupyter, view.handle = True, type("Handle", (), {"update": lambda self, data, raw: shown.append(data)})()
    view.show([("attempt_0", 0, "tick from rank 0")])
    now[0] += 0.1
    view.show([("attempt_0", 1, "tick from rank 1")])
    assert len(shown) == 1 and "rank 1" not in shown[-1]["text/plain"]  # held back: too soon after the first
    now[0] += 0.2
    view.show([])  # a tick with nothing new
    assert len(shown) == 2 and shown[-1]["text/plain"].endswith("[rank0] tick from rank 0\n[rank1] tick from rank 1")
    now[0] += 1
    view.show([])
    assert len(shown) == 2  # nothing pending: no update


def wait_until_both_ranks_hang(log_folder, marker):
    """Until both ranks of hang.py have printed their line: torchrun's per-rank logs, under the caller's TMPDIR."""
    deadline = time.monotonic() + 60
    while sum("hanging now" in log.read_text() for log in log_folder.glob("*/*/attempt_*/[0-9]*/stdout.log")) < 2:
        assert time.monotonic() < deadline, f"the ranks did not start: {processes_with(marker)}"
        time.sleep(0.1)


def test_interrupt_stops_every_process_and_propagates(launch_env, tmp_path):
    """The kernel's stop button: SIGINT to the process that called lessons.torchrun (a separate Python here, as a
    kernel is). The KeyboardInterrupt must stop torchrun and its workers and reach the caller.

    The caller installs Python's SIGINT handler itself, as ipykernel does: a process started in the background by
    a non-interactive shell (`cmd &`) inherits SIGINT *ignored*, and Python then leaves it ignored. Found when this
    test failed only in suites we had started with `&`."""
    caller = subprocess.Popen([sys.executable, "-c", (
        "import signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import lessons\n"
        "try:\n"
        f"    lessons.torchrun({str(FIXTURES / 'hang.py')!r}, nproc=2, timeout=60, env={launch_env!r}, show=False)\n"
        "except KeyboardInterrupt:\n"
        "    print('KeyboardInterrupt reached the caller')\n")], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)})  # where the launch's logs are, to see the ranks hang
    try:
        wait_until_both_ranks_hang(tmp_path, launch_env[MARKER])
        start = time.monotonic()
        caller.send_signal(signal.SIGINT)
        out, _ = caller.communicate(timeout=30)
    finally:
        caller.kill()
    assert out.strip() == "KeyboardInterrupt reached the caller"
    assert time.monotonic() - start < 2 * lessons.tools.launch.STOP_GRACE_S + 5
    # launch_env's teardown asserts that nothing is left.


@pytest.mark.parametrize("kwargs, error, text", [
    ({"script": "no_such_script.py"}, FileNotFoundError, "no such script: no_such_script.py"),
    ({"script": 42}, TypeError, "script must be a path"),
    ({"nproc": 0}, ValueError, "nproc must be between 1 and 32, got 0"),
    ({"nproc": 1000}, ValueError, "nproc must be between 1 and 32, got 1000"),
    ({"nproc": "2"}, TypeError, "nproc must be an int, not str"),
    ({"nproc": 2.0}, TypeError, "nproc must be an int, not float"),
    ({"args": "--steps 3"}, TypeError, "args must be a list or tuple"),
    ({"args": [None]}, TypeError, "each arg must be a str or number"),
    ({"timeout": -1}, ValueError, "timeout must be positive"),
    ({"timeout": "10"}, TypeError, "timeout must be seconds"),
    ({"threads_per_rank": 0}, ValueError, "threads_per_rank must be an int >= 1"),
    ({"timeout_from": ""}, ValueError, "timeout_from must be a non-empty line of text, or {rank: line} for every"),
    ({"timeout_from": {0: "ready"}}, ValueError, "timeout_from must be a non-empty line of text, or {rank: line}"),
    ({"timeout_from": "ready", "timeout": None}, ValueError, "timeout_from must be a non-empty line of text"),
])
def test_bad_input_is_refused_in_one_line(kwargs, error, text):
    kwargs = {"script": SCRIPTS / "hello_dist.py", **kwargs}
    with pytest.raises(error) as refused:
        lessons.torchrun(**kwargs)
    assert text in str(refused.value)
    assert "\n" not in str(refused.value)


def test_root_cause_prefers_the_rank_whose_own_code_raised():
    peer_lost = "Traceback (most recent call last):\n  ...\ntorch.distributed.DistBackendError: Connection closed by peer\n"
    own_bug = "Traceback (most recent call last):\n  ...\nValueError: bad shape\n"
    launch = LaunchResult(returncode=1, stderr={0: peer_lost, 1: own_bug, 2: peer_lost})
    assert root_cause_rank(launch, codes={0: 1, 1: 1, 2: 1}) == 1
    # Only peers' errors: the lowest such rank.
    launch = LaunchResult(returncode=1, stderr={0: "", 1: peer_lost})
    assert root_cause_rank(launch, codes={0: -15, 1: 1}) == 1


def test_result_line_and_progress_bars():
    launch = LaunchResult(returncode=0, stdout={0: 'hi\nRESULT {"a": 1}\n'})
    assert lessons.parse_result(launch.stdout[0]) == {"a": 1}
    assert as_terminal_shows("epoch 1:  50%|#  |\r epoch 1: 100%|##|\nnext") == " epoch 1: 100%|##|\nnext"


def test_command_line_for_a_terminal():
    assert lessons.command_line("ddp_scripts/ddp_minimal.py", 4, ["--steps", 3]) == (
        "OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo torchrun --standalone --local-addr=127.0.0.1 --nproc-per-node=4 "
        "ddp_scripts/ddp_minimal.py --steps 3")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun " in lessons.command_line("x.py", max_restarts=2)


def test_a_killed_kernel_takes_the_launch_with_it(launch_env, tmp_path):
    """The kernel process dies (Restart kernel, OOM killer): torchrun gets SIGTERM and stops its workers.
    A killed kernel cannot remove the launch's log directory: TMPDIR puts it in tmp_path, not in /tmp."""
    kernel = subprocess.Popen([sys.executable, "-c", (
        "import sys, lessons; "
        f"lessons.torchrun({str(FIXTURES / 'hang.py')!r}, nproc=2, timeout=120, env={launch_env!r})")],
        env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        wait_until_both_ranks_hang(tmp_path, launch_env[MARKER])
    finally:
        kernel.kill()
        kernel.wait()
    deadline = time.monotonic() + 3 * lessons.tools.launch.STOP_GRACE_S
    while processes_with(launch_env[MARKER]) and time.monotonic() < deadline:
        time.sleep(0.2)
    # launch_env's teardown asserts that nothing is left.


def test_root_cause_from_record_error_files_prefers_own_errors_on_a_timestamp_tie():
    from lessons.tools.failure import recorded_root_cause
    from lessons.tools.rank_output import Attempt

    def error(message, timestamp):
        return {"message": {"message": message, "extraInfo": {"py_callstack": f"Traceback ...\n{message}\n",
                                                              "timestamp": str(timestamp)}}}

    peer = "RuntimeError: Connection closed by peer [127.0.0.1]:1234"
    launch = LaunchResult(returncode=1, attempts=[Attempt(0, errors={0: error(peer, 100), 1: error("ValueError: bug", 100)})])
    assert recorded_root_cause(launch) == (1, "Traceback ...\nValueError: bug")
    launch = LaunchResult(returncode=1, attempts=[Attempt(0, errors={0: error("KeyError: a", 99), 1: error("ValueError: b", 100)})])
    assert recorded_root_cause(launch)[0] == 0  # earliest first, as torchrun does
    assert recorded_root_cause(LaunchResult(returncode=1, attempts=[Attempt(0)])) is None


@pytest.mark.parametrize("platform, interface", [
    ("linux", "lo"),  # WSL2 reports linux too: it runs a Linux kernel
    ("darwin", "lo0"),
    ("freebsd14", "lo0"),
])
def test_gloo_stays_on_the_loopback_interface_of_each_platform(platform, interface, monkeypatch):
    from lessons.tools.launch import loopback_interface
    assert loopback_interface(platform) == interface
    monkeypatch.setattr(sys, "platform", platform)  # what the launchers see on that platform
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert lessons.tools.launch.launch_environment(None)["GLOO_SOCKET_IFNAME"] == interface
    assert f"GLOO_SOCKET_IFNAME={interface} torchrun " in lessons.command_line("x.py")


def test_a_gloo_interface_set_by_the_learner_is_kept(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert lessons.tools.launch.launch_environment(None)["GLOO_SOCKET_IFNAME"] == "eth0"
