"""The code snapshot: a copy of your project taken at submit, run by every attempt of the run.

A requeue can start a day after the submit; by then the checkout holds other code. So submit copies the
code the job runs into ``<run dir>/code/`` (``hpc_agent.core.rundir``) and the job runs that copy: the folder is
first on its path (``PYTHONPATH`` in the job script, and ``code_manifest.activate`` ahead of the job's working
directory), and in command mode the script word points at the copy. Resubmissions by the watcher reuse the
run's snapshot: only ``hpc_agent.submit`` takes one.

What is copied (the *project*, :func:`select`):

* ``train.command``: the project of the first word that is an existing ``.py`` file under the submit's folder:
  the git work tree that holds it (its top folder), else the script's folder. The submit's folder, when it is
  inside the project, is where the job runs the command: its copy (``workdir`` in the manifest), so a path
  relative to it (``--data data/train.txt``) and one relative to the script (``Path(__file__).parent``) both
  find the copied files. ``code_manifest.snapshot_argv`` points the script word at its copy.
* ``train.workload: pkg.mod:build``: the top-level package ``pkg`` (its folder, by the same rule) or module
  (``pkg.py``), found with ``importlib`` *without importing it* (it may import torch).

In a git work tree the files are git's: tracked plus untracked-but-not-ignored (``git ls-files --cached
--others --exclude-standard``), and the manifest records ``HEAD`` and ``git diff HEAD`` (bounded). Elsewhere
the folder is walked, leaving out what ``.gitignore`` and ``.hpcignore`` in it match (gitignore patterns,
``pathspec``). ``.hpcignore`` at the top of the work tree (or of the folder) applies in both cases. Always left
out: hidden files and folders (``.git``, ``.env``, ``.venv``), ``__pycache__``, ``*.pyc``, virtualenvs
(``pyvenv.cfg``) and the runs root; the command's script itself is always copied.

Links are never followed. One whose target stays inside the project is copied as the same relative link (the
layout stays intact); one that points outside (an absolute target, or ``..`` out of it) is left out and named
in submit's output. Bounded by ``train.snapshot_max_mib`` and ``train.snapshot_max_files``: past them submit
stops (exit 2) naming the biggest folders and files and the fix. ``MANIFEST.json`` records the source, the
sha256 (``code_manifest.digest``), the counts, git's commit and diff, the script and the working directory.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import posixpath
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.user_code import is_reference
from hpc_agent.core import rundir
from hpc_agent.core.code_manifest import digest_update, link_entry, read_manifest

MAX_SCANNED = 100_000  # entries walked outside git: a folder of data must not stall the submit
IGNORE_FILE = ".hpcignore"
GIT_TIMEOUT_S = 30.0
LIST_MAX_BYTES = 32 << 20   # git ls-files' output (some 400 000 names: a monorepo, before .hpcignore)
DIFF_MAX_BYTES = 64 << 10   # the part of ``git diff HEAD`` the manifest keeps (read_manifest reads 1 MiB)
IGNORE_MAX_BYTES = 1 << 20  # a .gitignore / .hpcignore
OPT_OUT = "set train.snapshot_code=false to run it live instead (docs/your_script.md, docs/your_model.md)"


@dataclass(frozen=True)
class Limits:
    """``train.snapshot_max_files`` and ``train.snapshot_max_mib``, in files and bytes."""

    files: int = 20_000
    bytes: int = 200 << 20

    @classmethod
    def of(cls, cfg: Any) -> "Limits":
        t = cfg.train
        return cls(int(t.snapshot_max_files), int(t.snapshot_max_mib) << 20)


@dataclass(frozen=True)
class Plan:
    """What to copy: ``files`` are (source file, path relative to the code folder), sorted by the latter."""

    key: str                 # the config key a problem is reported on
    source: Path             # the project's top folder, the package folder, or the module file
    kind: str                # package | module | project
    files: Tuple[Tuple[Path, str], ...]
    bytes: int
    script: Optional[str] = None       # command mode: the script, relative to the code folder
    argv_index: Optional[int] = None   # command mode: which argv word is the script
    links: Tuple[Tuple[str, str], ...] = ()          # (path in the code folder, target): copied as links
    outside_links: Tuple[Tuple[str, str], ...] = ()  # (path, target): links out of the project, left out
    selection: str = "folder"          # git (git's file list) | folder (walked) | file (a module)
    git: Optional[Dict[str, Any]] = None  # commit, dirty, untracked, diff, diff_truncated
    workdir: Optional[str] = None      # command mode: the submit's folder in the copy ("." = its top); None: outside
    max_bytes: int = Limits.bytes      # what taking it may read in all (train.snapshot_max_mib)


@dataclass
class Selection:
    """The files (absolute path, path relative to the folder, size) and links :func:`select` found."""

    files: List[Tuple[Path, str, int]] = field(default_factory=list)
    links: List[Tuple[str, str]] = field(default_factory=list)
    outside_links: List[Tuple[str, str]] = field(default_factory=list)
    selection: str = "folder"
    git: Optional[Dict[str, Any]] = None
    top: Optional[Path] = None  # git: the work tree's top folder


# ---- pure rules ----------------------------------------------------------------------------------------
def wanted(cfg: Any) -> bool:
    """Whether this config runs the user's code from a snapshot."""
    t = cfg.train
    return bool(t.snapshot_code) and (bool(getattr(t, "command", None)) or is_reference(t.workload))


def skip_reason(path: Path, is_dir: bool, excluded: Sequence[Path] = ()) -> Optional[str]:
    """Why an entry is always left out of a snapshot (None: the ignore files decide). Links: :func:`link_inside`."""
    name = path.name
    if name.startswith("."):
        return "hidden"
    if is_dir:
        if name == "__pycache__":
            return "cache"
        if (path / "pyvenv.cfg").exists():
            return "virtualenv"
        if any(path == ex for ex in excluded):
            return "runs root"
        return None
    return "bytecode" if name.endswith((".pyc", ".pyo")) else None


def link_inside(rel: str, target: str) -> bool:
    """Whether a link at ``rel`` (relative to the project's top) pointing at ``target`` stays inside the
    project, judged on the text alone (nothing is followed): relative, and never ``..`` above the top."""
    if not target or posixpath.isabs(target):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return joined != ".." and not joined.startswith("../")


def workdir_in(top: Path, cwd: Path) -> Optional[str]:
    """The submit's folder as a path inside the project's copy ("." = its top), None when it is outside."""
    try:
        rel = Path(cwd).relative_to(top)
    except ValueError:
        return None
    return rel.as_posix() or "."


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} MiB"


def biggest(entries: Iterable[Tuple[str, int]], n: int = 5) -> List[str]:
    """The ``n`` biggest top-level folders (bytes, files) and the ``n`` biggest files, biggest first."""
    folders: Dict[str, List[int]] = {}
    files: List[Tuple[int, str]] = []
    for rel, size in entries:
        head, sep, _ = rel.partition("/")
        if sep:
            agg = folders.setdefault(head + "/", [0, 0])
            agg[0] += size
            agg[1] += 1
        files.append((size, rel))
    out = [f"{name} {_size(b)} ({c} files)" for name, (b, c) in
           sorted(folders.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:n]]
    out += [f"{rel} {_size(size)}" for size, rel in sorted(files, key=lambda f: (-f[0], f[1]))[:n]]
    return out


def cap_problem(key: str, source: Path, entries: Sequence[Tuple[str, int]], limits: Limits,
                ignore_at: Optional[Path] = None) -> Optional[Problem]:
    """The refusal of a project past the limits, naming its biggest parts and how to leave them out (in the
    ``.hpcignore`` of ``ignore_at``: the work tree's top, else ``source``)."""
    count, size = len(entries), sum(s for _, s in entries)
    if count <= limits.files and size <= limits.bytes:
        return None
    return Problem(key, str(source), f"code small enough to snapshot (at most {limits.files} files and "
                                     f"{limits.bytes >> 20} MiB; it has {count} files, {_size(size)}). Biggest: "
                                     f"{'; '.join(biggest(entries))}. Leave data out with lines such as `data/` or "
                                     f"`*.ckpt` in {Path(ignore_at or source) / IGNORE_FILE} (gitignore patterns), "
                                     f"raise train.snapshot_max_mib / train.snapshot_max_files, "
                                     f"or {OPT_OUT}")


def describe_source(plan_or_manifest: Dict[str, Any]) -> str:
    """``git 1a2b3c4d5e6f`` (``+ uncommitted changes``), or ``folder``: where the files came from."""
    git = plan_or_manifest.get("git")
    if plan_or_manifest.get("selection") != "git" or not isinstance(git, dict):
        return str(plan_or_manifest.get("selection") or "folder")
    commit = str(git.get("commit") or "")[:12] or "no commit yet"
    extra = []
    if git.get("changed"):
        extra.append(f"{git['changed']} changed tracked file{'s' if git['changed'] != 1 else ''}")
    if git.get("untracked"):
        extra.append(f"{git['untracked']} untracked file{'s' if git['untracked'] != 1 else ''}")
    return f"git {commit}" + (f", dirty: {', '.join(extra)}" if extra else ", clean")


# ---- reading the project (changes nothing) ---------------------------------------------------------------
def _run_bounded(argv: Sequence[str], max_bytes: int) -> Tuple[int, bytes, bool]:
    """(exit code, stdout, cut) of a command run without a shell, killed after GIT_TIMEOUT_S."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C", GIT_TERMINAL_PROMPT="0")
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env=env)
    timer = threading.Timer(GIT_TIMEOUT_S, proc.kill)
    timer.start()
    try:
        data = proc.stdout.read(max_bytes + 1)
        cut = len(data) > max_bytes
        if cut:
            proc.kill()
        proc.stdout.close()
        code = proc.wait()
    finally:
        timer.cancel()
    if code == -9 and not cut:
        raise subprocess.TimeoutExpired(list(argv), GIT_TIMEOUT_S)
    return code, data[:max_bytes], cut


def _git(folder: Path, *args: str, max_bytes: int = LIST_MAX_BYTES) -> Tuple[int, bytes, bool]:
    # No hook, external diff or text conversion runs: git only lists and diffs.
    return _run_bounded(["git", "-c", "core.fsmonitor=false", "-c", "diff.external=", "-C", str(folder), *args],
                        max_bytes)


def git_top(folder: Path) -> Optional[Path]:
    """The top of the git work tree that holds ``folder`` (None: none, or no git here)."""
    try:
        code, out, _ = _git(folder, "rev-parse", "--show-toplevel", max_bytes=64 << 10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.decode("utf-8", "surrogateescape").strip()
    return Path(text).resolve() if code == 0 and text else None


def _git_list(folder: Path, key: str, *which: str) -> List[str]:
    try:
        code, out, cut = _git(folder, "ls-files", "-z", "--full-name", *which)
    except subprocess.TimeoutExpired:
        raise ConfigError([Problem(key, str(folder), f"a git work tree git can list within {GIT_TIMEOUT_S:.0f} s; "
                                                     f"leave big folders out in {IGNORE_FILE}, or {OPT_OUT}")])
    if cut or code != 0:
        why = f"more than {LIST_MAX_BYTES >> 20} MiB of file names" if cut else f"git ls-files exit {code}"
        raise ConfigError([Problem(key, str(folder), f"a git work tree git can list ({why}); {OPT_OUT}")])
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def git_state(top: Path, untracked: int) -> Dict[str, Any]:
    """HEAD, the tracked files changed since, ``git diff HEAD`` (at most DIFF_MAX_BYTES), untracked files copied."""
    state: Dict[str, Any] = {"commit": None, "changed": 0, "untracked": untracked, "diff": "",
                             "diff_truncated": False}
    try:
        code, out, _ = _git(top, "rev-parse", "--verify", "-q", "HEAD", max_bytes=4096)
        if code != 0:
            return state  # no commit yet: every file is new
        state["commit"] = out.decode().strip()
        code, names, _ = _git(top, "diff", "--name-only", "-z", "HEAD")
        state["changed"] = len([n for n in names.split(b"\0") if n]) if code == 0 else 0
        code, diff, cut = _git(top, "diff", "--no-ext-diff", "--no-textconv", "--no-color", "HEAD",
                               max_bytes=DIFF_MAX_BYTES)
        if code == 0 or cut:
            text = diff.decode("utf-8", "replace")
            state["diff"] = text[:text.rfind("\n") + 1] if cut else text
            state["diff_truncated"] = cut
    except (OSError, subprocess.TimeoutExpired):
        pass  # the files are already chosen; the record of where they came from is what is missing
    state["dirty"] = bool(state["changed"] or untracked)
    return state


def ignore_spec(*files: Path):
    """The gitignore patterns in these files (missing ones have none; later lines win), or None."""
    import pathspec

    lines: List[str] = []
    for path in files:
        try:
            lines += rundir.read_bounded(Path(path), IGNORE_MAX_BYTES).decode("utf-8", "replace").splitlines()
        except OSError:  # none there (or not a regular file): no patterns
            continue
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


def _ignored(spec: Any, rel: str, is_dir: bool = False) -> bool:
    return spec is not None and spec.match_file(rel + ("/" if is_dir else ""))


def _always_out(folder: Path, rel: str, excluded: Sequence[Path], cache: Dict[str, bool]) -> bool:
    """:func:`skip_reason` for ``rel`` and each folder above it up to ``folder`` (git lists files, not folders)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        d = "/".join(parts[:i])
        if d not in cache:
            cache[d] = skip_reason(folder / d, True, excluded) is not None
        if cache[d]:
            return True
    return skip_reason(folder / rel, False) is not None


def _entry(folder: Path, rel: str, out: Selection) -> bool:
    """Add ``folder/rel`` to ``out``: a regular file, or a link (sorted by :func:`link_inside`); True if added."""
    import stat as _stat

    path = folder / rel
    try:
        info = path.lstat()
    except OSError:
        return False  # listed by git but deleted since
    if _stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            return False
        inside = link_inside(rel, target)
        (out.links if inside else out.outside_links).append((rel, target))
        return inside
    if _stat.S_ISREG(info.st_mode):
        out.files.append((path, rel, info.st_size))
        return True
    return False  # a socket, FIFO, device, or a folder git lists (a submodule): not copied


def select(folder: Path, key: str, excluded: Sequence[Path] = (), keep: Sequence[Path] = ()) -> Selection:
    """The files of ``folder`` by the project rule (module docstring), relative to it; ``keep``: files copied
    whatever the rules say (the command's script). A link counts as inside when it stays inside ``folder``."""
    folder = Path(folder).resolve()
    top = git_top(folder)
    out = Selection()
    cache: Dict[str, bool] = {}
    if top is not None:
        out.selection, out.top = "git", top
        prefix = workdir_in(top, folder)
        prefix = "" if prefix in (None, ".") else prefix + "/"
        tracked = _git_list(folder, key, "--cached")
        ignore = top / IGNORE_FILE  # also given to git, so that it does not walk into what it leaves out
        extra = [f"--exclude-from={ignore}"] if ignore.is_file() and not ignore.is_symlink() else []
        untracked = set(_git_list(folder, key, "--others", "--exclude-standard", *extra))
        spec = ignore_spec(top / IGNORE_FILE)  # its patterns are relative to the work tree's top
        copied_untracked = 0
        for full in sorted(set(tracked) | untracked):
            rel = full[len(prefix):]
            if not full.startswith(prefix) or _ignored(spec, full) or _always_out(folder, rel, excluded, cache):
                continue
            copied_untracked += _entry(folder, rel, out) and full in untracked
        out.git = git_state(top, copied_untracked)
    else:
        spec = ignore_spec(folder / ".gitignore", folder / IGNORE_FILE)
        scanned = 0
        for here, dirs, names in os.walk(folder, followlinks=False):
            rel_here = Path(here).relative_to(folder).as_posix()
            rel_here = "" if rel_here == "." else rel_here + "/"
            scanned += len(dirs) + len(names)
            if scanned > MAX_SCANNED:
                raise ConfigError([Problem(key, str(folder), f"a folder with fewer than {MAX_SCANNED} entries to look "
                                                             f"through for code (stopped in {here}); leave folders out "
                                                             f"in {folder / IGNORE_FILE}, or {OPT_OUT}")])
            keep_dirs = []
            for d in dirs:
                rel = rel_here + d
                if Path(here, d).is_symlink():  # os.walk lists a link to a folder among the folders
                    if not _ignored(spec, rel) and not skip_reason(Path(here, d), False):
                        _entry(folder, rel, out)
                elif not skip_reason(Path(here, d), True, excluded) and not _ignored(spec, rel, True):
                    keep_dirs.append(d)
            dirs[:] = sorted(keep_dirs)
            for name in sorted(names):
                rel = rel_here + name
                if not skip_reason(Path(here, name), False) and not _ignored(spec, rel):
                    _entry(folder, rel, out)
    have = {rel for _, rel, _ in out.files}
    for path in keep:
        rel = Path(path).relative_to(folder).as_posix()
        if rel not in have and path.is_file() and not path.is_symlink():
            out.files.append((Path(path), rel, path.stat().st_size))
    return out


def _plan(key: str, source: Path, kind: str, sel: Selection, limits: Limits, prefix: str = "",
          **extra: Any) -> Plan:
    join = (lambda rel: f"{prefix}/{rel}") if prefix else (lambda rel: rel)
    files = sorted(((p, join(rel), size) for p, rel, size in sel.files), key=lambda f: f[1])
    if problem := cap_problem(key, source, [(rel, size) for _, rel, size in files], limits, sel.top):
        raise ConfigError([problem])
    return Plan(key, source, kind, tuple((p, rel) for p, rel, _ in files), sum(s for _, _, s in files),
                links=tuple(sorted((join(r), t) for r, t in sel.links)),
                outside_links=tuple(sorted((join(r), t) for r, t in sel.outside_links)),
                selection=sel.selection, git=sel.git, max_bytes=limits.bytes, **extra)


def find_top_level(name: str, cwd: Path):
    """The module spec of the top-level ``name``, searched in ``cwd`` then sys.path, without importing it
    (the ``hpc-agent`` console script does not have the working directory on sys.path)."""
    spec = PathFinder.find_spec(name, [str(cwd)] + [p or str(cwd) for p in sys.path])
    if spec is None:
        try:  # other finders (editable installs) answer through importlib; still nothing is executed
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
    return spec


def workload_plan(ref: str, cwd: Path, excluded: Sequence[Path] = (), limits: Limits = Limits()) -> Plan:
    """The package or module that ``train.workload: pkg.mod:build`` imports first."""
    top = ref.partition(":")[0].split(".")[0]
    spec = find_top_level(top, cwd)
    if spec is None:
        raise ConfigError([Problem("train.workload", ref, f"an importable package: {top!r} is neither in {cwd} nor "
                                   "on sys.path; run submit from the folder that holds it, or add its parent folder "
                                   "to PYTHONPATH")])
    locations = list(spec.submodule_search_locations or [])
    if len(locations) == 1 and Path(locations[0]).is_dir():
        root = Path(locations[0]).resolve()
        return _plan("train.workload", root, "package", select(root, "train.workload", excluded), limits, prefix=top)
    if not locations and spec.origin and str(spec.origin).endswith(".py") and Path(spec.origin).is_file():
        path = Path(spec.origin).resolve()
        sel = Selection(files=[(path, f"{top}.py", path.stat().st_size)], selection="file")
        return _plan("train.workload", path, "module", sel, limits)
    where = spec.origin or ", ".join(locations) or "?"
    raise ConfigError([Problem("train.workload", ref, f"a Python source package or module to snapshot ({top!r} is "
                               f"at {where}); {OPT_OUT}")])


def script_index(argv: Sequence[str], cwd: Path) -> Optional[int]:
    """The first argv word that is an existing ``.py`` file under ``cwd`` (None: no script to copy)."""
    base = Path(cwd).resolve()
    for i, word in enumerate(argv):
        if not str(word).endswith(".py"):
            continue
        path = (base / str(word)).resolve()
        if path.is_file() and path.is_relative_to(base):
            return i
    return None


def command_plan(argv: Sequence[str], cwd: Path, excluded: Sequence[Path] = (),
                 limits: Limits = Limits()) -> Optional[Plan]:
    """The script's project: its git work tree, else its folder (None when argv names no script)."""
    index = script_index(argv, cwd)
    if index is None:
        return None
    cwd = Path(cwd).resolve()
    script = (cwd / str(argv[index])).resolve()
    top = git_top(script.parent) or script.parent
    sel = select(top, "train.command", excluded, keep=[script])
    return _plan("train.command", top, "project", sel, limits, script=script.relative_to(top).as_posix(),
                 argv_index=index, workdir=workdir_in(top, cwd))


def left_out_args(plan: Optional[Plan], argv: Sequence[str], cwd: Path) -> List[str]:
    """The command's relative paths (``--data data/x``, ``--data=data/x``) that exist in the submit's folder,
    inside the project, but not in the snapshot (ignored): the job, run in the copy, would not find them."""
    if plan is None or plan.workdir is None or plan.argv_index is None:
        return []
    copied = {rel for _, rel in plan.files} | {rel for rel, _ in plan.links}
    folders = {posixpath.dirname(rel) for rel in copied}
    for d in list(folders):
        while d:
            d = posixpath.dirname(d)
            folders.add(d)
    out = []
    for word in [str(w) for w in argv[plan.argv_index + 1:]]:
        value = word.partition("=")[2] if word.startswith("-") and "=" in word else word
        if not value or value.startswith(("-", "/")) or len(value) > 4096:
            continue
        rel = posixpath.normpath(posixpath.join("" if plan.workdir == "." else plan.workdir, value))
        if rel == ".." or rel.startswith("../") or rel in copied or rel in folders or rel == ".":
            continue
        if os.path.lexists(Path(cwd) / value):
            out.append(value)
    return out


def plan_for(cfg: Any, cwd: Path) -> Optional[Plan]:
    """What submit copies for this config (None: nothing); raises ConfigError naming the fix."""
    if not wanted(cfg):
        return None
    runs_root = (Path(cwd) / Path(cfg.run.runs_root).expanduser()).resolve()
    limits = Limits.of(cfg)
    if getattr(cfg.train, "command", None):
        return command_plan(cfg.train.command, cwd, [runs_root], limits)
    return workload_plan(str(cfg.train.workload), Path(cwd), [runs_root], limits)


# ---- taking it, and using it ---------------------------------------------------------------------------
def take(plan: Plan, run_dir: Path) -> Dict[str, Any]:
    """Copy ``plan`` into ``<run_dir>/code`` (built aside, renamed into place when complete); the manifest.
    Files are read without following a link at any component below the project's top; links are made last, so
    nothing is ever written through one."""
    import hashlib

    from hpc_agent.core.filemodes import file_mode_in, make_dir, open_created
    from hpc_agent.core.fsutil import atomic_write_json

    dest = rundir.code_dir(run_dir)
    tmp = Path(run_dir) / f".{rundir.CODE}.tmp-{os.getpid()}"
    make_dir(tmp, exist_ok=False)
    h = hashlib.sha256()
    total = 0
    within = plan.source if plan.kind != "module" else None
    entries = sorted([(rel, src, "") for src, rel in plan.files]
                     + [(link_entry(rel, t)[0], rel, t) for rel, t in plan.links], key=lambda e: e[0])
    try:
        for key, src, link_target in entries:  # in path order: the digest is code_manifest.digest's
            if link_target:
                digest_update(h, *link_entry(str(src), link_target))
                continue
            data = rundir.read_bounded(src, max(plan.max_bytes - total, 0), within=within)
            total += len(data)
            target = tmp / key
            make_dir(target.parent)
            fd = open_created(target, os.O_WRONLY | os.O_EXCL, file_mode_in(tmp))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            digest_update(h, key, data)
        for rel, target in plan.links:
            make_dir((tmp / rel).parent)
            os.symlink(target, tmp / rel)
        manifest = {"source": str(plan.source), "kind": plan.kind, "selection": plan.selection,
                    "sha256": h.hexdigest(), "files": len(plan.files), "links": len(plan.links), "bytes": total,
                    "path": str(dest), "script": plan.script, "argv_index": plan.argv_index,
                    "workdir": plan.workdir, "git": plan.git,
                    "outside_links": [f"{rel} -> {t}" for rel, t in plan.outside_links[:20]],
                    "taken_at": _dt.datetime.now().isoformat(timespec="seconds")}
        atomic_write_json(tmp / rundir.CODE_MANIFEST, manifest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def run_json_entry(run_dir: Path) -> Optional[Dict[str, Any]]:
    """``code_snapshot`` for run.json: source, sha256, files, bytes, path, git commit (None without a snapshot)."""
    try:
        manifest = read_manifest(run_dir)
    except (OSError, ValueError) as exc:  # run.json still gets written: say what is wrong instead
        return {"path": str(rundir.code_dir(run_dir)), "error": f"MANIFEST unreadable: {exc}"}
    if not manifest:
        return None
    entry = {k: manifest.get(k) for k in ("source", "sha256", "files", "bytes", "path")}
    git = manifest.get("git")
    if isinstance(git, dict):
        entry["git"] = {k: git.get(k) for k in ("commit", "dirty")}
    return entry


def summary(plan_or_manifest: Dict[str, Any]) -> str:
    """``12 files, 34.5 KiB, git 1a2b3c4d5e6f, clean`` (and the links left out): what was or will be copied."""
    m = plan_or_manifest
    links = f", {m['links']} links" if m.get("links") else ""
    text = f"{m['files']} files{links}, {m['bytes'] / 1024:.1f} KiB, {describe_source(m)}"
    outside = m.get("outside_links") or []
    if outside:
        text += (f"; left out {len(outside)} link(s) pointing outside the project: {', '.join(outside[:3])}"
                 + (" ..." if len(outside) > 3 else ""))
    return text


def plan_manifest(plan: Plan, run_dir: Path) -> Dict[str, Any]:
    """The manifest :func:`take` will write, less what only copying tells (sha256, taken_at): the dry run's."""
    return {"source": str(plan.source), "kind": plan.kind, "selection": plan.selection, "files": len(plan.files),
            "links": len(plan.links), "bytes": plan.bytes, "path": str(rundir.code_dir(run_dir)),
            "script": plan.script, "argv_index": plan.argv_index, "workdir": plan.workdir, "git": plan.git,
            "outside_links": [f"{rel} -> {t}" for rel, t in plan.outside_links]}


def dry_run_lines(plan: Optional[Plan], cfg: Any, run_dir: Path, cwd: Path) -> List[str]:
    """What ``submit --dry-run`` says of the command and the snapshot: the command as every rank runs it (the
    script's copy), the folder it runs in, and what is copied (the same rules the job applies:
    ``code_manifest.snapshot_argv`` and ``snapshot_workdir``)."""
    from hpc_agent.core.code_manifest import snapshot_argv, snapshot_workdir
    from hpc_agent.core.redact import redact_command

    manifest = plan_manifest(plan, run_dir) if plan is not None else None
    lines = []
    if getattr(cfg.train, "command", None):
        code = rundir.code_dir(run_dir)
        argv = snapshot_argv(cfg.train.command, manifest, code) if manifest else list(cfg.train.command)
        where = cfg.container.workdir or (manifest and snapshot_workdir(manifest, code)) or str(cwd)
        shown = redact_command(argv, cfg.env_origin.get("train.command", []), os.environ)
        lines.append(f"# Command (once per rank, in {where}): {shown}")
    if manifest is not None:
        lines.append(f"# Code snapshot: {summary(manifest)}; from {manifest['source']} -> {manifest['path']}")
    return lines


def describe(manifest: Dict[str, Any]) -> str:
    """The line submit prints."""
    return (f"code:         {manifest['source']} -> {manifest['path']} ({summary(manifest)}, "
            f"sha256 {manifest['sha256'][:12]})")


def setup_lines(cfg: Any) -> List[str]:
    """Job-script lines (``{run_dir}`` filled and quoted by ``jobs.executor``): the snapshot first on PYTHONPATH."""
    if not wanted(cfg):
        return []
    return [f"export PYTHONPATH={{run_dir}}/{rundir.CODE}" + "${PYTHONPATH:+:$PYTHONPATH}"]
