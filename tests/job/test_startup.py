"""launch/startup.py: the job's heavy imports run with the garbage collector paused, and what they leave
behind is frozen out of later collections. The time it saves is in scripts/bench/step_overhead.py
(``start_to_first_step_s``)."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref

import pytest

from helpers.common import REPO
from launch.startup import collector_paused


@pytest.fixture
def clean_gc():
    enabled = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's objects go back to the normal generations
    (gc.enable if enabled else gc.disable)()


class _Cycle:
    def __init__(self):
        self.me = self


def test_the_collector_is_off_inside_and_what_lives_at_the_end_is_frozen(clean_gc):
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
        made = _Cycle()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0 and gc.is_tracked(made)
    alive = weakref.ref(made)
    del made  # garbage now (a cycle), but frozen: no collection frees it
    gc.collect()
    assert alive() is not None
    gc.unfreeze()  # back in a generation: collectable again
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was_even_after_an_error(clean_gc, enabled):
    (gc.enable if enabled else gc.disable)()
    with pytest.raises(ImportError):
        with collector_paused():
            raise ImportError("a missing module")
    assert gc.isenabled() is enabled


def test_heavy_imports_leave_dynamo_and_deepspeed_loaded_and_the_collector_on():
    probe = ("import gc, json, sys\n"
             "from launch.startup import MUON_MODULE, import_heavy_modules\n"
             "import_heavy_modules()\n"
             "print(json.dumps({'enabled': gc.isenabled(), 'frozen': gc.get_freeze_count(),\n"
             "                  'loaded': [m in sys.modules for m in ('torch._dynamo', 'deepspeed', MUON_MODULE)]}))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["enabled"] and got["loaded"] == [True, True, True], got
    assert got["frozen"] > 100_000, got  # torch and DeepSpeed's objects: out of every later collection
