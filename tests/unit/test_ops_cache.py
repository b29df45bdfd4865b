"""hpc_agent.core.ops_cache and hpc_agent.checks.envcheck: where prepared DeepSpeed ops live, how a job decides it may
load one, and what the doctor says about them and about torch build locks. No torch needed here."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpc_agent.checks import envcheck
from hpc_agent.core.fsutil import atomic_write_json
from hpc_agent.core.ops_cache import (MANIFEST, OPS_DIR_ENV, STALE_LOCK_AGE_S, PreparedOp, Runtime, cpu_flags,
                                      find_build_locks, find_prepared, manifest_data, missing_op_message, ops_dir,
                                      read_manifest, runtime_dir, sha256_of, torch_extensions_roots)
from tests.conftest import run_cli

RT = Runtime("cpu", "cp311", "2.13.0+cpu", "0.19.8", "x86_64")
FLAGS = frozenset({"avx", "avx2", "fma", "sse4_2"})


def prepared(root: Path, name: str = "deepspeed_shm_comm", payload: bytes = b"\x7fELF fake op",
             flags=FLAGS, runtime: Runtime = RT) -> Path:
    where = runtime_dir(root, runtime)
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"{name}-abc.so"
    lib.write_bytes(payload)
    op = PreparedOp(name, lib.name, sha256_of(lib), len(payload), tuple(sorted(flags)), "login1", 1.0)
    atomic_write_json(where / MANIFEST, manifest_data(runtime, [op]))
    return lib


def test_ops_dir_is_in_the_environment_unless_set():
    assert ops_dir({}, "/venv") == Path("/venv/share/hpc_agent/deepspeed_ops")
    assert ops_dir({OPS_DIR_ENV: "/shared/ops"}, "/venv") == Path("/shared/ops")
    assert ops_dir({OPS_DIR_ENV: "  "}, "/venv") == Path("/venv/share/hpc_agent/deepspeed_ops")


def test_runtime_key_names_everything_a_build_depends_on_and_is_a_safe_dir_name():
    key = RT.key()
    for part in ("cpu", "cp311", "2.13.0+cpu", "0.19.8", "x86_64"):
        assert part in key
    assert "/" not in Runtime("cu/da", "cp311", "2.11.0+cu130", "0.19.8", "x86_64").key()
    assert Runtime("cuda", "cp311", "2.13.0+cu130", "0.19.8").key() != RT.key()


def test_cpu_flags_keep_only_isa_flags():
    text = "processor : 0\nflags\t\t: fpu vme avx avx2 avx512f sse4_2 fma hypervisor ht\n\nprocessor : 1\nflags : fpu\n"
    assert cpu_flags(text) == frozenset({"avx", "avx2", "avx512f", "sse4_2", "fma"})
    assert cpu_flags("Features : fp asimd aes sha1\n") == frozenset({"aes"})
    assert cpu_flags("") == frozenset()


def test_a_prepared_op_is_found(tmp_path):
    lib = prepared(tmp_path)
    assert find_prepared("deepspeed_shm_comm", RT, tmp_path, FLAGS | {"avx512f"}) == (lib, "")
    # A node whose flags could not be read is not refused for it.
    assert find_prepared("deepspeed_shm_comm", RT, tmp_path, frozenset())[0] == lib


@pytest.mark.parametrize("case, expect", [
    ("nothing prepared", "no manifest.json"),
    ("other runtime", "prepared there: cuda-"),
    ("other op", "lists deepspeed_shm_comm, not cpu_adam"),
    ("truncated library", "not the size the manifest records"),
    ("replaced library", "does not match the manifest's sha256"),
    ("library is a symlink", "not the size the manifest records"),
    ("older cpu", "CPU features this node lacks (avx2, fma)"),
    ("manifest is garbage", "not a valid manifest"),
    ("manifest is a symlink", "cannot open"),
    ("manifest is a fifo", "not a regular file"),
    ("manifest is huge", "larger than"),
])
def test_what_a_job_refuses_to_load_and_why(tmp_path, case, expect):
    op, flags = "deepspeed_shm_comm", FLAGS
    if case == "other runtime":
        prepared(tmp_path, runtime=Runtime("cuda", "cp311", "2.13.0+cu130", "0.19.8", "x86_64"))
    elif case != "nothing prepared":
        lib = prepared(tmp_path)
        manifest = lib.parent / MANIFEST
        if case == "other op":
            op = "cpu_adam"
        elif case == "truncated library":
            lib.write_bytes(b"\x7fELF")
        elif case == "replaced library":
            lib.write_bytes(b"\x7fELF evil op")  # same size, other bytes
        elif case == "library is a symlink":
            target = tmp_path / "elsewhere.so"
            lib.rename(target)
            lib.symlink_to(target)
        elif case == "older cpu":
            flags = frozenset({"avx", "sse4_2"})
        elif case == "manifest is garbage":
            manifest.write_text("{not json")
        elif case == "manifest is a symlink":
            real = tmp_path / "real.json"
            manifest.rename(real)
            manifest.symlink_to(real)
        elif case == "manifest is a fifo":
            manifest.unlink()
            os.mkfifo(manifest)
        elif case == "manifest is huge":
            manifest.write_text(" " * (2 << 20))
    path, why = find_prepared(op, RT, tmp_path, flags)
    assert path is None and expect in why, why


def test_read_manifest_round_trip(tmp_path):
    lib = prepared(tmp_path)
    ops, runtime, why = read_manifest(lib.parent / MANIFEST)
    assert why == "" and runtime["torch"] == "2.13.0+cpu" and ops["deepspeed_shm_comm"].file == lib.name


def test_the_missing_op_message_starts_with_the_fix(monkeypatch):
    monkeypatch.delenv(OPS_DIR_ENV, raising=False)
    text = missing_op_message("cpu_adam", RT, Path("/x"), "no manifest.json in /x", python="/venv/bin/python")
    assert text.index("Fix: `/venv/bin/python -m hpc_agent.prepare`") < 120
    assert "cpu_adam" in text and "no manifest.json" in text and "torch 2.13.0+cpu" in text
    monkeypatch.setenv(OPS_DIR_ENV, "/shared/ops")
    assert f"`{OPS_DIR_ENV}=/shared/ops /venv/bin/python -m" in missing_op_message("x", RT, Path("/shared/ops"), "y",
                                                                                   python="/venv/bin/python")


# --- torch build locks -----------------------------------------------------------------------------------

def test_torch_extensions_roots_follow_torch():
    assert torch_extensions_roots({"TORCH_EXTENSIONS_DIR": "/e"}) == [Path("/e")]
    assert torch_extensions_roots({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == [Path("/c/torch_extensions")]
    assert torch_extensions_roots({"HOME": "/h"}) == [Path("/h/.cache/torch_extensions")]


def test_build_locks_in_every_layout_with_their_age(tmp_path):
    now = time.time()
    layouts = [tmp_path / "ext" / "deepspeed_shm_comm" / "lock",  # TORCH_EXTENSIONS_DIR
               tmp_path / "cache" / "py311_cpu" / "cpu_adam" / "lock",  # torch's default root
               tmp_path / "ops" / RT.key() / "build" / "deepspeed_shm_comm" / "lock"]  # prepare's build dir
    for i, lock in enumerate(layouts):
        lock.parent.mkdir(parents=True)
        lock.touch()
        os.utime(lock, (now - 3600 * i, now - 3600 * i))
    found = {lock.path: lock for lock in find_build_locks([tmp_path / "ext", tmp_path / "cache", tmp_path / "ops",
                                                          tmp_path / "absent"], now=now)}
    assert set(found) == set(layouts)
    assert not found[layouts[0]].stale and found[layouts[1]].stale and found[layouts[2]].age_s >= 7200
    assert found[layouts[1]].fix() == f"rm -f {layouts[1]}"


# --- the doctor's checks ---------------------------------------------------------------------------------

def test_doctor_ops_check(tmp_path):
    versions = {"torch": "2.13.0+cpu", "deepspeed": "0.19.8"}.get
    env = {OPS_DIR_ENV: str(tmp_path)}
    level, _, detail = envcheck.check_deepspeed_ops(env, versions)
    assert level == envcheck.FAIL and "jobs would exit 72" in detail and "-m hpc_agent.prepare" in detail
    prepared(tmp_path, runtime=Runtime("cpu", envcheck.python_tag(), "2.13.0+cpu", "0.19.8"))
    level, _, detail = envcheck.check_deepspeed_ops(env, versions)
    assert level == envcheck.OK and "cpu: deepspeed_shm_comm" in detail
    level, _, detail = envcheck.check_deepspeed_ops(env, {"torch": "2.14.0+cpu", "deepspeed": "0.19.8"}.get)
    assert level == envcheck.FAIL and "prepared there for other versions" in detail
    assert envcheck.check_deepspeed_ops(env, lambda dist: None)[0] == envcheck.WARN


def test_doctor_finds_a_stale_torch_extension_lock(tmp_path):
    """Must-show 4: the doctor CLI, run as a user whose torch cache holds a lock left by a killed build."""
    home = tmp_path / "home"
    lock = home / ".cache" / "torch_extensions" / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - STALE_LOCK_AGE_S - 60
    os.utime(lock, (old, old))
    env = {"HOME": str(home), "XDG_CACHE_HOME": "", "TORCH_EXTENSIONS_DIR": "", OPS_DIR_ENV: str(tmp_path / "ops")}
    res = run_cli("-m", "hpc_agent.doctor", "--json", env=env, timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    report = json.loads(res.stdout)
    (check,) = [c for c in report["checks"] if c["name"] == "build lock"]
    assert check["level"] == "WARN" and "stale" in check["detail"] and f"Fix: rm -f {lock}" in check["detail"]


def test_a_second_prepare_waits_for_the_first_then_gives_up_naming_it(tmp_path):
    from hpc_agent.core.fsutil import hold_lock
    from launch.ops import _take_lock

    path = tmp_path / ".prepare.lock"
    held = hold_lock(path)
    notes = []
    with pytest.raises(TimeoutError, match=rf"another prepare \(pid {os.getpid()}\) has held"):
        _take_lock(path, notes.append, wait_s=0.2, poll_s=0.05)
    assert notes and f"pid {os.getpid()}" in notes[0]
    held.close()  # the holder is gone: the next prepare gets the lock at once
    _take_lock(path, notes.append, wait_s=0.2, poll_s=0.05).close()
