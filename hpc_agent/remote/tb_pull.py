"""``review --remote USER@LOGIN RUN --pull DIR``: mirror a run's TensorBoard files incrementally, review locally.

TensorBoard event files and ``events.jsonl`` are append-only, so a pull asks the login node only for the
bytes past what the mirror already holds: the laptop sends ``{"have": {key: {ino, size, mtime}}}`` on stdin
to the hidden ``hpc-agent review PATH --export-tb`` on the login node, which answers one JSON object with
each file's new byte range (base64), at most :data:`BUDGET` bytes per reply (``more`` asks for another
round). A file whose inode changed or that shrank is sent again from byte 0. ``config.yaml`` and ``run.json``
(rewritten, not appended; a few KiB) are sent whole when their inode, size or mtime changed. A second pull of
a finished run therefore moves 0 new bytes.

Both halves trust nothing from the other: the login node reads only regular files, never through a link
(``O_NOFOLLOW``; a ``tb/`` that is a link is skipped), bounded; the laptop writes only names it expects
(``config.yaml``, ``run.json``, ``events.jsonl``, ``tb/events.out.tfevents.*``) under run ids that are one
plain path component, into 0700 folders, never through a link. Then the ordinary local review (table,
``--json``, ``--plot``, ``--serve``) runs on the mirror, which is a run directory like any other.
"""
from __future__ import annotations

import base64
import fnmatch
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.core import json_safe, rundir
from hpc_agent.metrics.tb_reader import EVENT_GLOB
from hpc_agent.remote import ssh

BUDGET = 16 << 20          # bytes of file data per reply (base64 makes the reply ~4/3 of it)
WHOLE_MAX = rundir.CONFIG_MAX_BYTES  # config.yaml / run.json larger than this are not theirs: skipped
MAX_TB_FILES = 4096
MAX_HAVE_BYTES = 4 << 20   # the laptop's list of what it has, read from stdin
WHOLE = (rundir.CONFIG, rundir.RUN_JSON)
APPENDED = (rundir.EVENTS,)
STATE_FILE = ".hpc_agent_pull.json"
MARKER = b"HPC_AGENT_TB_EXPORT:"  # before the reply: a login shell that prints a banner cannot corrupt it


def safe_name(name: Any) -> bool:
    """One plain path component: no separator, no NUL or control character, not ``.``/``..``/hidden."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\\" not in name
            and not name.startswith(".") and name.isprintable())


def wanted(rel: Any) -> bool:
    """A relative path a pull may write: the run files, or an event file directly under tb/."""
    if rel in WHOLE or rel in APPENDED:
        return True
    if not isinstance(rel, str) or not rel.startswith(rundir.TB + "/"):
        return False
    name = rel[len(rundir.TB) + 1:]
    return safe_name(name) and fnmatch.fnmatch(name, EVENT_GLOB)


# --- the login-node half ----------------------------------------------------------------------------------
def _candidates(run_dir: Path, notes: List[str]) -> List[str]:
    rels = [*WHOLE, *APPENDED]
    tb = rundir.tb_dir(run_dir)
    if tb.is_symlink():
        notes.append(f"{tb} is a symbolic link; not following it")
    elif tb.is_dir():
        names = sorted(e.name for e in os.scandir(tb) if e.is_file(follow_symlinks=False))
        rels += [f"{rundir.TB}/{n}" for n in names if wanted(f"{rundir.TB}/{n}")][:MAX_TB_FILES]
    return rels


def _export_file(run_dir: Path, rel: str, have: Dict[str, Any], left: int, notes: List[str]) -> Optional[Dict[str, Any]]:
    try:
        fd, size = rundir._open_regular(run_dir / rel)  # O_NOFOLLOW|O_NONBLOCK, S_ISREG on the descriptor
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(str(exc))
        return None
    try:
        st = os.fstat(fd)
        ino, mtime = f"{st.st_dev}:{st.st_ino}", st.st_mtime_ns
        if rel in WHOLE:
            if size > WHOLE_MAX:
                notes.append(f"{run_dir / rel} is {size} bytes; not sending it")
                return None
            same = (have.get("ino"), have.get("size"), have.get("mtime")) == (ino, size, mtime)
            start, count = (size, 0) if same else (0, size)
        else:
            held = have.get("size")
            start = held if have.get("ino") == ino and isinstance(held, int) and 0 <= held <= size else 0
            count = min(size - start, left)
        data = os.pread(fd, count, start) if count > 0 else b""
    finally:
        os.close(fd)
    return {"path": rel, "ino": ino, "mtime": mtime, "size": size, "offset": start,
            "data": base64.b64encode(data).decode("ascii")}


def export(path: Path, have: Dict[str, Any], budget: int = BUDGET) -> Dict[str, Any]:
    """The reply to one pull round (pure apart from reading the run directories)."""
    from hpc_agent.runs.history import find_runs

    _, run_dirs = find_runs(path)
    runs, notes, left, more = [], [], budget, False
    for run_dir in run_dirs:
        files = []
        for rel in _candidates(run_dir, notes):
            entry = _export_file(run_dir, rel, have.get(f"{run_dir.name}/{rel}") or {}, left, notes)
            if entry is None:
                continue
            sent = len(base64.b64decode(entry["data"]))
            left -= sent
            more |= entry["offset"] + sent < entry["size"]
            files.append(entry)
        runs.append({"run_id": run_dir.name, "files": files})
    return {"version": 1, "runs": runs, "more": more, "notes": notes}


def export_main(path: Path, stream=None) -> int:
    """``review PATH --export-tb``: what the mirror has on stdin, the reply on stdout."""
    raw = (stream if stream is not None else sys.stdin.buffer).read(MAX_HAVE_BYTES + 1)
    try:
        request = json_safe.loads(raw or b"{}", json_safe.Limits(max_line_bytes=MAX_HAVE_BYTES))[0]
        have = request.get("have", {}) if isinstance(request, dict) else None
        budget = min(int(request.get("budget", BUDGET)), BUDGET) if isinstance(request, dict) else BUDGET
    except (ValueError, TypeError):
        have = None
    if not isinstance(have, dict) or not path.is_dir():
        print("review --export-tb: a run directory and a JSON request on stdin", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stdout.buffer.write(MARKER + json.dumps(export(path, have, max(1, budget))).encode() + b"\n")
    sys.stdout.buffer.flush()
    return 0


# --- the laptop half --------------------------------------------------------------------------------------
def _safe_dir(folder: Path) -> Path:
    from hpc_agent.core.filemodes import make_dir

    if folder.is_symlink():
        raise OSError(f"{folder} is a symbolic link; not writing through it")
    make_dir(folder)
    return folder


def _write(target: Path, offset: int, data: bytes) -> None:
    """Bytes at ``offset`` (0: replace the file), never through a link; an append that finds the file at
    another size than expected raises (the state is dropped and the next round starts the file over)."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(target, flags | (os.O_TRUNC if offset == 0 else 0), 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != offset:
            raise OSError(f"{target} is not the {offset} bytes the mirror recorded")
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _load_state(mirror: Path) -> Dict[str, Any]:
    try:
        data = rundir.read_bounded(mirror / STATE_FILE, MAX_HAVE_BYTES)
    except OSError:
        return {}
    return json_safe.loads_object(data, json_safe.Limits(max_line_bytes=MAX_HAVE_BYTES))[0]


def apply(mirror: Path, reply: Dict[str, Any], state: Dict[str, Any]) -> Dict[str, int]:
    """Write one reply into the mirror; counts of new TensorBoard bytes, other bytes and files touched."""
    counts = {"tb_bytes": 0, "other_bytes": 0, "files": 0, "runs": 0, "dropped": 0}
    for run in reply.get("runs", []):
        run_id = run.get("run_id")
        if not safe_name(run_id):
            raise ValueError(f"the login node named a run {run_id!r}: not a plain folder name")
        counts["runs"] += 1
        run_dir = _safe_dir(mirror / run_id)
        for entry in run.get("files", []):
            rel, key = entry.get("path"), f"{run_id}/{entry.get('path')}"
            if not wanted(rel) or not isinstance(entry.get("offset"), int) or entry["offset"] < 0:
                raise ValueError(f"the login node sent {rel!r}: not a file a pull writes")
            data = base64.b64decode(entry.get("data", ""), validate=True)
            if rel.startswith(rundir.TB + "/"):
                _safe_dir(run_dir / rundir.TB)
            try:
                if data or entry["offset"] == 0 and (state.get(key) or {}).get("size") != entry["size"]:
                    _write(run_dir / rel, entry["offset"], data)
            except OSError as exc:
                print(f"review --pull: {exc}; fetching it again", file=sys.stderr)
                state.pop(key, None)
                counts["dropped"] += 1
                continue
            counts["tb_bytes" if rel.startswith(rundir.TB + "/") else "other_bytes"] += len(data)
            counts["files"] += bool(data)
            state[key] = {"ino": entry.get("ino"), "size": entry["offset"] + len(data), "mtime": entry.get("mtime")}
    return counts


def pull(rem: "ssh.Remote", path: str, mirror: Path, max_rounds: int = 10000) -> Dict[str, Any]:
    """Bring ``mirror`` up to date with the login node's ``path`` (a run dir or a runs root)."""
    _safe_dir(mirror)
    state = _load_state(mirror)
    total = {"tb_bytes": 0, "other_bytes": 0, "files": 0, "runs": 0, "run_ids": [], "rounds": 0, "notes": []}
    for _ in range(max_rounds):
        proc = rem.run("review", [path, "--export-tb"], capture=True,
                       stdin=json.dumps({"have": state, "budget": BUDGET}).encode())
        if proc.returncode != 0:
            raise ssh.RemoteError(f"review --export-tb on the login node failed ({proc.returncode}): "
                                  f"{proc.stderr.decode(errors='replace').strip()[-2000:]}")
        if MARKER not in proc.stdout:
            raise ValueError(f"the login node's reply has no {MARKER.decode()} (an older hpc_agent there?)")
        reply = json.loads(proc.stdout.rsplit(MARKER, 1)[1])
        counts = apply(mirror, reply, state)
        total["rounds"] += 1
        total["runs"] = counts["runs"]
        for name in ("tb_bytes", "other_bytes", "files"):
            total[name] += counts[name]
        total["run_ids"] = [r["run_id"] for r in reply.get("runs", [])]
        total["notes"] = list(reply.get("notes", []))
        tmp = mirror / (STATE_FILE + ".tmp")
        tmp.unlink(missing_ok=True)
        _write(tmp, 0, json.dumps(state).encode())
        os.replace(tmp, mirror / STATE_FILE)
        if not reply.get("more") and not counts["dropped"]:
            break
    return total


def drop_option(words: Sequence[str], name: str) -> List[str]:
    """``words`` without ``name VALUE`` / ``name=VALUE`` (the local review does not get --pull)."""
    out, i = [], 0
    while i < len(words):
        if words[i] == name:
            i += 2
            continue
        if not words[i].startswith(name + "="):
            out.append(words[i])
        i += 1
    return out


def pull_for_review(args, argv: Sequence[str]) -> Tuple[int, Optional[List[str]]]:
    """Pull and say what moved; returns (exit code, the argv of the ordinary review to run on the mirror with
    the other flags as typed), the argv None when the pull failed. review's CLI runs it: this module sits
    below the CLI layer."""
    mirror = Path(args.pull).expanduser()
    try:
        got = pull(ssh.Remote(args), args.path, mirror)
    except (ssh.RemoteError, OSError, ValueError) as exc:
        print(f"review --pull: {exc}", file=sys.stderr)
        return 2, None
    target = mirror / got["run_ids"][0] if len(got["run_ids"]) == 1 else mirror
    for note in got["notes"]:
        print(f"review --pull: note from the login node: {note}", file=sys.stderr)
    print(f"pulled {got['tb_bytes']} new TensorBoard bytes and {got['other_bytes']} bytes of run files "
          f"({got['files']} files, {got['rounds']} round(s)) from {args.remote}:{args.path} into {target}",
          file=sys.stderr if args.json else sys.stdout, flush=True)
    words = drop_option(ssh.split_argv(argv), "--pull")
    if args.path in words:
        words.remove(args.path)
    return 0, [str(target), *words]
