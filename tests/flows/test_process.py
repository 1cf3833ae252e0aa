"""What flows/_process.py says and does about processes (issue 50), in the default suite (seconds): an exit status in
words (a signal by name, the out-of-memory killer when the kernel counted one, never "bad input"); a pid and its
start time name one process (a record of a dead one is not taken for whoever got the pid since, of this user or
another); the orphans a killed stage leaves are adopted and stopped; a stage command's failure reported by how it
ended. The same on real runs, with kill -9 and the out-of-memory killer: tests/flows/test_faults.py (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from flows import _process
from stages.core.errors import PipelineError


def test_an_exit_status_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _process.how_it_ended(1) == "exited with status 1"
    assert _process.how_it_ended(-15) == _process.how_it_ended(143) == "was stopped by SIGTERM"
    assert _process.how_it_ended(130) == "was stopped by SIGINT"
    monkeypatch.setattr(_process, "oom_kills", lambda: 5)
    assert _process.how_it_ended(-9, oom_before=5).startswith("was killed by SIGKILL (kill -9; the kernel counted no")
    assert _process.how_it_ended(137, oom_before=4).startswith("was killed by SIGKILL: the out-of-memory killer")


def test_a_stage_failure_is_named_by_how_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit status 2 is the stage's own one-line bad-input error; any other failure is not called bad input."""
    from dvc.exceptions import DvcException
    from dvc.stage.exceptions import StageCmdFailedError

    from flows import pipeline

    def failed(status: int) -> Exception:
        e = DvcException("failed to reproduce 'corpus'")
        e.__cause__ = StageCmdFailedError("python -m flows.corpus", status)
        return pipeline._stage_failure("corpus", e, oom_before=3)

    monkeypatch.setattr(_process, "oom_kills", lambda: 4)
    assert isinstance(failed(2), PipelineError)
    for status, said in ((1, "stage corpus exited with status 1"), (-9, "stage corpus was killed by SIGKILL: the "
                                                                      "out-of-memory killer")):
        e = failed(status)
        assert isinstance(e, _process.RunFailed) and str(e).startswith(said), e
    monkeypatch.setitem(pipeline._run, "gone", lambda: "the stage server (pid 7) was killed by SIGKILL")
    assert str(failed(-15)).startswith("the stage server (pid 7) was killed by SIGKILL while stage corpus ran")


def test_a_pid_and_its_start_time_name_one_process(other_user) -> None:
    me = _process.start_time(os.getpid())
    assert me is not None and _process.same_process(os.getpid(), me)
    assert not _process.same_process(os.getpid(), me - 1)  # the pid, reused by another process of mine
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not _process.same_process(dead.pid, None)
    his = other_user.popen(["sleep", "30"])
    try:
        # his process, with the very pid and start time a record of ours might hold: not ours
        assert _process.alive(his.pid) and not _process.same_process(his.pid, _process.start_time(his.pid))
    finally:
        his.kill()
        his.wait()


ORPHANS = textwrap.dedent('''
    import os, subprocess, sys, time
    from flows import _process
    assert _process.adopt_orphans()
    # a "stage" that starts a worker and dies at once, as one killed by SIGKILL would: the worker is orphaned
    subprocess.run(["sh", "-c", "sleep 300 & echo $!"], stdout=open("orphan.pid", "w"), check=True)
    orphan = int(open("orphan.pid").read())
    time.sleep(0.2)
    adopted = _process.parent_of(orphan) == os.getpid()
    stopped = _process.stop_leftovers(keep=[])
    print(adopted, [s.split(":")[0] for s in stopped] == [str(orphan)], _process.alive(orphan))
''')


def test_what_a_stage_leaves_is_adopted_and_stopped(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", ORPHANS], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(_process.__file__).rsplit("/flows/", 1)[0]})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False"], out.stdout
