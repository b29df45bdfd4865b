"""How a preempted attempt hands its job back to Slurm fast: the batch shell requeues it after the step ends.

After SIGUSR2 (a preemption notice or the time-limit warning) every rank writes its part of the checkpoint
and exits with ``EXIT_SIGNALLED_AFTER_CHECKPOINT`` (75). In the job script hpc_agent renders
(:func:`batch_requeue_lines`, appended after submitit's ``srun`` line), the batch shell then runs
``scontrol requeue`` itself. Why not rank 0, before it exits, as submitit does: measured on the localhost
Slurm 22.05 (scripts/bench/recovery.py), a requeue while the step's tasks still live leaves the step to
slurmstepd's kill loop, which checks for leftover processes with 1 s sleeps and ends the step ~2.3 s later;
Slurm requeues the job (and frees its nodes) only then. A requeue issued after the step has ended is done
in ~0.1 s. The ranks leave the requeue to the batch shell only when :data:`BATCH_REQUEUE_ENV` is set, so a
user's own script keeps the old in-job requeue.

The ranks exit **0**, not 75, and rank 0 first leaves a marker file (:func:`marker_path`) that says "the
checkpoint is complete, requeue me": submitit's ``srun --kill-on-bad-exit=1`` answers a task's non-zero exit
by terminating the step, and a terminated step ends ~2.7 s after its last task is gone (slurmstepd's kill
loop, measured on the localhost Slurm 22.05), while a step whose tasks exit 0 ends at once. The nodes stay
COMPLETING, and the requeued job cannot start anywhere, until the step has ended. The batch shell turns
"srun returned 0 and the marker is there" back into exit 75, so the job's exit code still says what happened.
If rank 0 cannot write the marker it exits 75 and the slower path above still requeues.

The batch shell cannot also expedite the requeued job (``scontrol update StartTime=now``): Slurm sets the
requeued job's begin time (now + 121 s) when the requeue completes, after the batch step is gone, so an
update issued from inside the job is overwritten (measured). The watcher expedites it: the batch shell touches
:data:`WAKE_FILE` after the requeue, which ends the watcher's sleep, and the watcher polls every
:data:`FAST_POLL_S` while a run is between its requeue and its expedite.

Even so the requeued job starts only at Slurm's next event-triggered scheduling pass, up to
``batch_sched_delay`` (3 s) later: the pass that runs when the requeue completes comes before the expedite can
(the begin time is set in that same moment). With ``resilience.successor_on_preempt`` the batch shell hands
over instead (:func:`successor_lines`): a successor job, queued and eligible before this job ends, is started
in that very pass (scripts/bench/handover.py: 0.97 s vs 3.94 s after the preempting job's submission).
"""
from __future__ import annotations

import os
import re
import shlex
from typing import List, Optional

from hpc_agent.core.exit_codes import EXIT_SIGNALLED_AFTER_CHECKPOINT

BATCH_REQUEUE_ENV = "HPC_AGENT_BATCH_REQUEUE"
RUNS_ROOT_ENV = "HPC_AGENT_RUNS_ROOT"
"""The runs root, exported by the job script: where the batch shell and the ranks look for the kill switch."""


MARKER_PREFIX = ".handback-"


def marker_path(run_dir, job_id: str):
    """Where rank 0 marks "checkpoint complete, requeue job ``job_id``" (``$SLURM_JOB_ID``, never the array
    form: the batch shell and the ranks both read it from their environment)."""
    import os

    return os.path.join(str(run_dir), f"{MARKER_PREFIX}{job_id}")


def batch_setup_lines(successor_dir: Optional[str] = None, runs_root: Optional[str] = None) -> List[str]:
    """Job-script lines before srun: the ranks leave the requeue to the batch shell; a marker left by an
    earlier attempt of this job (it died before its batch shell read it) must not requeue this one. With
    ``successor_dir`` (submitit's folder; ``resilience.successor_on_preempt``) the batch shell hands over to a
    successor job instead (:func:`successor_lines`), and a job that is itself a successor cancels its held
    predecessor as it starts (:func:`predecessor_lines`), in the background. ``runs_root`` is exported for the
    kill-switch check (:func:`paused_lines`; without it the run dir's parent is used)."""
    lines = [f"export {RUNS_ROOT_ENV}={shlex.quote(runs_root)}"] if runs_root else []
    lines += [f"export {BATCH_REQUEUE_ENV}=1",
              'if [ -n "${HPC_AGENT_RUN_DIR:-}" ] && [ -n "${SLURM_JOB_ID:-}" ]; then '
              f'rm -f "$HPC_AGENT_RUN_DIR/{MARKER_PREFIX}$SLURM_JOB_ID"; fi']
    if successor_dir:
        lines.append(f"export {SUCCESSOR_DIR_ENV}={shlex.quote(successor_dir)}")
        lines += [*paused_lines(), *slurm_helper_lines(), *predecessor_lines(),
                  "hpc_agent_cancel_predecessor & hpc_agent_predecessor_pid=$!"]
    return lines


def batch_teardown_lines(successor: bool = False) -> List[str]:
    """Run right after submitit's srun line: ``$?`` is the step's exit code (the highest of its tasks). With
    ``successor`` (``resilience.successor_on_preempt``; the setup lines then came from
    ``batch_setup_lines(successor_dir)``, which define the helper functions) the batch shell first tries to hand
    over to a successor job (:func:`successor_lines`) and requeues only if that fails and was rolled back."""
    code = EXIT_SIGNALLED_AFTER_CHECKPOINT
    hand_over = [
        *successor_lines(),
        f"# {code}: every rank saved the checkpoint after SIGUSR2 and ended: hand over to a successor job, or if",
        "# that fails (and was rolled back) requeue now (hpc_agent/core/handback.py)",
        "hpc_agent_handed=1",
        f'if [ "$hpc_agent_rc" = {code} ] && [ -n "${{{SUCCESSOR_DIR_ENV}:-}}" ] && [ -z "${{SLURM_ARRAY_JOB_ID:-}}" ]; then',
        "    hpc_agent_hand_over; hpc_agent_handed=$?",
        "fi",
        'if [ "$hpc_agent_handed" = 0 ]; then',
        wake_line(),
        'elif [ "$hpc_agent_handed" = 2 ]; then',
        '    echo "[hpc_agent] job $SLURM_JOB_ID is not requeued: its successor may still be queued (named in '
        f'{SUCCESSOR_PREFIX}$SLURM_JOB_ID), and a run must never run twice; exiting {code}" >&2',
        wake_line(),
        f'elif [ "$hpc_agent_rc" = {code} ]; then',
    ] if successor else [
        f"# {code}: every rank saved the checkpoint after SIGUSR2 and ended: requeue now (hpc_agent/core/handback.py)",
        f'if [ "$hpc_agent_rc" = {code} ]; then',
    ]
    return [
        "hpc_agent_rc=$?",
        # Self-contained: the functions again (the setup has its own copies), so that no edit of the setup can
        # leave the kill-switch check undefined here (an undefined hpc_agent_paused would read as "not paused").
        *paused_lines(),
        *([*slurm_helper_lines(),
           'if [ -n "${hpc_agent_predecessor_pid:-}" ]; then wait "$hpc_agent_predecessor_pid" 2>/dev/null; fi']
          if successor else []),
        "# 0 with rank 0's marker: every rank saved the checkpoint after SIGUSR2 and exited 0, so that the step",
        f"# ended at once (hpc_agent/core/handback.py); report it as {code}. The marker's second word is the signal's",
        "# reason as rank 0 read it from Slurm (hpc_agent/slurm/usr2.py): only a preemption or the time limit hands over",
        f'hpc_agent_marker="${{HPC_AGENT_RUN_DIR:-/nonexistent}}/{MARKER_PREFIX}${{SLURM_JOB_ID:-}}"',
        "hpc_agent_reason=",
        'if [ "$hpc_agent_rc" = 0 ] && [ -f "$hpc_agent_marker" ] && [ ! -L "$hpc_agent_marker" ]; then',
        '    hpc_agent_reason=$(head -c 64 "$hpc_agent_marker" 2>/dev/null | { read -r _ r _; echo "$r"; })',
        f'    rm -f "$hpc_agent_marker"; hpc_agent_rc={code}',
        "fi",
        *hand_over,
        '    hpc_agent_job=$SLURM_JOB_ID',
        '    if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then hpc_agent_job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}; fi',
        '    if hpc_agent_paused; then',
        f'        echo "[hpc_agent] the kill switch is set ($hpc_agent_pause_file): job $hpc_agent_job is not requeued; '
        f'exiting {code} for the watcher to resume after watch --resume" >&2',
        '    elif scontrol requeue "$hpc_agent_job"; then',
        "    " + wake_line(),
        "    else",
        '        echo "[hpc_agent] could not requeue job $hpc_agent_job; '
        f'exiting {code} for the watcher to resume" >&2',
        "    fi",
        "fi",
        "# any other failure (a host OOM, a crash, a repair budget spent): the watcher acts now, not at its next tick",
        f'if [ "$hpc_agent_rc" != 0 ] && [ "$hpc_agent_rc" != {code} ]; then',
        wake_line(),
        "fi",
        'exit "$hpc_agent_rc"',
    ]


# --- the kill switch, seen from the job ----------------------------------------------------------------
def paused_lines() -> List[str]:
    """A bash function for the teardown: ``hpc_agent_paused`` succeeds when the runs root's kill switch is set
    (``hpc_agent.core.rundir.PAUSE_FILE``: any entry, even a dangling link, as ``hpc_agent.state.killswitch``
    reads it), and leaves its path in ``$hpc_agent_pause_file``. The runs root is ``$HPC_AGENT_RUNS_ROOT``,
    else the run dir's parent. Checked right before each ``scontrol`` the batch shell runs on its own."""
    from hpc_agent.core.rundir import PAUSE_FILE

    return [
        "hpc_agent_paused() {",
        f'    local root="${{{RUNS_ROOT_ENV}:-}}"',
        '    if [ -z "$root" ] && [ -n "${HPC_AGENT_RUN_DIR:-}" ]; then root="$HPC_AGENT_RUN_DIR/.."; fi',
        f'    hpc_agent_pause_file="$root/{PAUSE_FILE}"',
        '    [ -n "$root" ] && { [ -e "$hpc_agent_pause_file" ] || [ -L "$hpc_agent_pause_file" ]; }',
        "}",
    ]


def pause_file_in_job(environ) -> Optional[str]:
    """The kill switch's path when it is set, seen from a rank (the same rule as :func:`paused_lines`), else
    None. A rank that would run ``scontrol requeue`` itself asks this first."""
    from hpc_agent.core.rundir import PAUSE_FILE

    root = environ.get(RUNS_ROOT_ENV) or (os.path.dirname(os.path.normpath(environ["HPC_AGENT_RUN_DIR"]))
                                          if environ.get("HPC_AGENT_RUN_DIR") else "")
    if not root:
        return None
    path = os.path.join(root, PAUSE_FILE)
    return path if os.path.lexists(path) else None


# --- handing over to a successor job (resilience.successor_on_preempt) -----------------------------------
SUCCESSOR_DIR_ENV = "HPC_AGENT_SUCCESSOR_DIR"
"""Set (to submitit's folder) in the job script when the run hands over to a successor at a preemption."""
SUCCESSOR_PREFIX = ".successor-"
"""``<run dir>/.successor-<old job id>`` holds the successor's job id: the watcher follows that job from then on."""
_JOB_NUMBER = re.compile(r"^[0-9]{1,20}$")
MAX_MARKER_BYTES = 64


PREEMPTED, TIME_LIMIT, STRAY, UNKNOWN = "preempted", "time_limit", "stray", "unknown"
"""Why a job got SIGUSR2, as rank 0 read it from Slurm (``hpc_agent.slurm.usr2``); the second word of the
hand-back marker. Only :data:`HANDS_OVER` reasons hand over to a successor."""
HANDS_OVER = (PREEMPTED, TIME_LIMIT)
HANDOVER_FAULT_ENV = "HPC_AGENT_HANDOVER_FAULT"
"""Tests only: ``after_release`` makes the hand-over fail right after ``scontrol release`` of the successor (as if
the answer was lost or ``requeuehold`` failed), the worst moment, so that the rollback is exercised for real."""
SLURM_TIMEOUT_S = 20
"""The bound on each Slurm command the batch shell runs for the hand-over (``timeout``, where installed)."""
KILL_AFTER_S = 2
"""A successor that is not gone this long after the rollback's ``scancel`` has started: its ranks would wait for
``KillWait`` (30 s by default) after the SIGTERM, while the preempted job itself has only its partition's
``GraceTime`` left; so it gets ``scancel --full --signal=KILL`` (batch shell and steps, at once)."""
ROLLBACK_WAIT_S = 60
"""How long a failed hand-over tries to cancel its successor and see it gone (squeue) before it gives up."""
PREDECESSOR_WAIT_S = 90
"""How long a successor waits for its predecessor to be requeued held (its batch shell may still be handing
over) before it leaves it to the watcher or the user."""


def slurm_helper_lines() -> List[str]:
    """Bash functions for the hand-over: ``hpc_agent_slurm`` runs a Slurm command bounded by
    :data:`SLURM_TIMEOUT_S`; ``hpc_agent_job_state JOB`` prints slurmctld's state of the job, ``GONE`` when it
    holds it no more (not listed, an ended state, or an unknown id) and ``?`` when squeue failed;
    ``hpc_agent_cancel_confirmed JOB`` cancels it (and kills it after :data:`KILL_AFTER_S`) and succeeds only once
    squeue shows it gone (scancel's own exit status says nothing about that: it is 0 for an unknown or ended
    job), within :data:`ROLLBACK_WAIT_S`."""
    return [
        "hpc_agent_slurm() {",
        f'    if command -v timeout >/dev/null 2>&1; then timeout {SLURM_TIMEOUT_S} "$@"; else "$@"; fi',
        "}",
        "hpc_agent_job_state() {",
        "    local out",
        '    if out=$(hpc_agent_slurm squeue --noheader --jobs "$1" --format %T 2>&1); then',
        '        case "$out" in ""|BOOT_FAIL|CANCELLED|COMPLETED|DEADLINE|FAILED|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|TIMEOUT) '
        'echo GONE ;; *) echo "$out" ;; esac',
        "    else",
        '        case "$out" in *"Invalid job id"*) echo GONE ;; *) echo "?" ;; esac',
        "    fi",
        "}",
        "hpc_agent_cancel_confirmed() {",
        f"    local deadline=$((SECONDS + {ROLLBACK_WAIT_S})) i",
        "    while [ $SECONDS -lt $deadline ]; do",
        '        if hpc_agent_slurm scancel "$1"; then',
        f"            for i in $(seq {KILL_AFTER_S * 2}); do",
        '                [ "$(hpc_agent_job_state "$1")" = GONE ] && return 0',
        "                sleep 0.5",
        "            done",
        "            # started already: its ranks wait for KillWait after the SIGTERM; kill it, batch shell and all, now",
        '            hpc_agent_slurm scancel --full --signal=KILL "$1"',
        "            while [ $SECONDS -lt $deadline ]; do",
        '                [ "$(hpc_agent_job_state "$1")" = GONE ] && return 0',
        "                sleep 0.5",
        "            done",
        "        else",
        "            sleep 1",
        "        fi",
        "    done",
        "    return 1",
        "}",
    ]


def predecessor_lines() -> List[str]:
    """A bash function for the setup: a successor (a job named in some ``.successor-<old>`` marker of its run
    dir) cancels its predecessor ``<old>`` once that is requeued held, so that nothing of the run is left in the
    queue without a watcher. Only a *pending* predecessor is cancelled (``scancel --state=PENDING``): while the
    successor lives, the predecessor is pending only as the held job of a completed hand-over (a failed one
    cancels the successor and sees it gone before it requeues its own job); a predecessor still running is
    still in its teardown, so it is asked again every 0.5 s for :data:`PREDECESSOR_WAIT_S`. The kill switch
    leaves the predecessor alone (held, it never starts; the watcher cancels it after ``--resume``)."""
    return [
        "hpc_agent_cancel_predecessor() {",
        f"    local f old state deadline=$((SECONDS + {PREDECESSOR_WAIT_S}))",
        '    [ -n "${HPC_AGENT_RUN_DIR:-}" ] && [ -n "${SLURM_JOB_ID:-}" ] || return 0',
        f'    for f in "$HPC_AGENT_RUN_DIR"/{SUCCESSOR_PREFIX}*; do',
        f'        old=${{f##*/{SUCCESSOR_PREFIX}}}',
        '        case "$old" in ""|*[!0-9]*) continue ;; esac',
        '        [ -f "$f" ] && [ ! -L "$f" ] || continue',
        f'        [ "$(head -c {MAX_MARKER_BYTES} "$f" 2>/dev/null | tr -d "[:space:]")" = "$SLURM_JOB_ID" ] || continue',
        "        while :; do",
        '            state=$(hpc_agent_job_state "$old")',
        '            if [ "$state" = GONE ]; then',
        '                echo "[hpc_agent] job $SLURM_JOB_ID took over from job $old, which is no longer queued" >&2; return 0',
        '            elif [ "$state" = PENDING ] && hpc_agent_paused; then',
        '                echo "[hpc_agent] the kill switch is set ($hpc_agent_pause_file): held predecessor job $old is '
        'not cancelled (it never starts by itself)" >&2; return 0',
        '            elif [ "$state" = PENDING ] && hpc_agent_slurm scancel --state=PENDING "$old" '
        '&& [ "$(hpc_agent_job_state "$old")" = GONE ]; then',
        '                echo "[hpc_agent] job $SLURM_JOB_ID took over from job $old: cancelled held job $old" >&2; return 0',
        "            elif [ $SECONDS -ge $deadline ]; then",
        '                echo "[hpc_agent] job $SLURM_JOB_ID took over from job $old, but job $old is still $state after '
        f'{PREDECESSOR_WAIT_S} s: left to the watcher (or scancel $old)" >&2; return 1',
        "            fi",
        "            sleep 0.5",
        "        done",
        "    done",
        "    return 0",
        "}",
    ]


def successor_lines() -> List[str]:
    """A bash function for the teardown: submit this job's script again as a held successor, give it a copy of
    submitit's pickle under its own id, tell the watcher and the successor (:func:`successor_path`), release it,
    and requeue this job *held*. Slurm schedules at once when the requeue completes; the successor, already
    queued and eligible, starts in that pass (the requeued job would wait out its 121 s begin delay first), and
    cancels this held job (:func:`predecessor_lines`).

    Returns 0 when handed over; 1 when not, with nothing left behind (the caller requeues as before): the
    signal was not a preemption or the time limit (``$hpc_agent_reason``, from rank 0's marker), the kill switch
    is set, a file is missing, sbatch failed, or a later step failed and the rollback cancelled the successor
    and saw it gone; 2 when the rollback could not confirm that a released successor is gone: the marker is
    kept (it names the successor, which may run the run) and the caller must not requeue."""
    reasons = "|".join(HANDS_OVER)
    return [
        "hpc_agent_hand_over() {",
        f'    local dir="${SUCCESSOR_DIR_ENV}" old="$SLURM_JOB_ID" new out v released=0 unset=() timeout=()',
        f'    local m="${{HPC_AGENT_RUN_DIR:-}}/{SUCCESSOR_PREFIX}$SLURM_JOB_ID"',
        f'    case "${{hpc_agent_reason:-}}" in {reasons}) ;; *)',
        '        echo "[hpc_agent] job $old is not handed over to a successor: its SIGUSR2 was '
        '${hpc_agent_reason:-of unknown reason}, not a preemption or the time limit (hpc_agent/core/handback.py)" >&2',
        "        return 1 ;; esac",
        "    hpc_agent_paused && return 1  # the kill switch: no successor (the caller says so and does not requeue)",
        '    [ -f "$dir/${old}_submission.sh" ] && [ -f "$dir/${old}_submitted.pkl" ] && [ -n "${HPC_AGENT_RUN_DIR:-}" ] || return 1',
        "    # This job's SLURM_* variables must not reach the successor (SLURM_CONF, which sbatch needs, stays).",
        '    for v in $(compgen -e); do case "$v" in SLURM_CONF) ;; SLURM_*) unset+=(-u "$v") ;; esac; done',
        f"    if command -v timeout >/dev/null 2>&1; then timeout=(timeout {SLURM_TIMEOUT_S}); fi",
        '    out=$(env "${unset[@]}" "${timeout[@]}" sbatch --parsable --hold "$dir/${old}_submission.sh") || return 1',
        '    new=${out%%;*}',
        '    case "$new" in ""|*[!0-9]*) return 1 ;; esac',
        '    if cp "$dir/${old}_submitted.pkl" "$dir/.${new}_submitted.pkl.tmp" \\',
        '        && mv -f "$dir/.${new}_submitted.pkl.tmp" "$dir/${new}_submitted.pkl" \\',
        '        && cp "$dir/${old}_submission.sh" "$dir/${new}_submission.sh" \\',
        """        && printf '%s\\n' "$new" > "$m.tmp" && mv -f "$m.tmp" "$m" \\""",
        '        && released=1 && hpc_agent_slurm scontrol release "$new" \\',
        f'        && [ "${{{HANDOVER_FAULT_ENV}:-}}" != after_release ] \\',
        '        && hpc_agent_slurm scontrol requeuehold "$old"; then',
        '        echo "[hpc_agent] job $old handed over to job $new (successor released; this job requeued held)" >&2',
        "        return 0",
        "    fi",
        "    # Roll back: the successor must be gone (checked) before this job may requeue itself.",
        '    echo "[hpc_agent] hand-over of job $old to job $new failed; cancelling job $new" >&2',
        '    if hpc_agent_cancel_confirmed "$new"; then',
        '        rm -f "$m" "$m.tmp" "$dir/${new}_submitted.pkl" "$dir/${new}_submission.sh"',
        '        echo "[hpc_agent] job $new cancelled and gone from the queue; requeueing job $old instead" >&2',
        "        return 1",
        "    fi",
        '    if [ "$released" = 0 ]; then  # still held: it can never start; said, and left for the watcher',
        '        rm -f "$m" "$m.tmp"',
        '        echo "[hpc_agent] held job $new could not be confirmed cancelled (it never starts by itself: '
        'scancel $new); requeueing job $old instead" >&2',
        "        return 1",
        "    fi",
        """    [ -f "$m" ] || { printf '%s\\n' "$new" > "$m.tmp" && mv -f "$m.tmp" "$m"; }""",
        f'    echo "[hpc_agent] could not confirm within {ROLLBACK_WAIT_S} s that released job $new is gone; $m names it" >&2',
        "    return 2",
        "}",
    ]


def successor_path(run_dir, job_id: str) -> str:
    """Where the batch shell of job ``job_id`` names its successor."""
    return os.path.join(str(run_dir), f"{SUCCESSOR_PREFIX}{job_id}")


def read_successor(run_dir, job_id: str) -> Optional[str]:
    """The successor job id that job ``job_id`` handed over to, or None. The job wrote the file, so it is
    untrusted: a regular file (a link is not followed), a few bytes, one job number other than ``job_id``."""
    from hpc_agent.core import rundir

    try:  # a regular file, no link followed, at most MAX_MARKER_BYTES (else UnsafeFile, an OSError)
        text = rundir.read_bounded(successor_path(run_dir, job_id), MAX_MARKER_BYTES)
    except OSError:
        return None
    value = text.decode("ascii", "replace").strip()
    return value if _JOB_NUMBER.match(value) and value != str(job_id) else None


MAX_CHAIN = 1000
"""The most hand-overs :func:`job_chain` follows (a loop of markers, written by a job, must not spin)."""


def job_chain(run_dir, job_ids) -> List[str]:
    """One run's Slurm jobs in order: ``job_ids`` (what the ledger or ``run.json`` knows; duplicates and empties
    dropped), then the successors their markers name from the newest on (:func:`read_successor`), which a job
    hands over to without a watcher. The last one is the run's current job."""
    chain: List[str] = []
    for job_id in job_ids:
        if job_id and str(job_id) not in chain:
            chain.append(str(job_id))
    while chain and len(chain) < MAX_CHAIN:
        successor = read_successor(run_dir, chain[-1])
        if successor is None or successor in chain:
            break
        chain.append(successor)
    return chain


# --- waking the watcher -------------------------------------------------------------------------------
WAKE_FILE = "watch.wake"
"""In the runs root (each run dir's parent). The batch shell touches it right after its requeue, so the watcher
ends its sleep and expedites the requeued job within a fraction of a second instead of up to ``--interval``
later; and when the training step failed any other way, so the watcher diagnoses and resubmits at once. The watcher only compares its mtime (never reads it, never follows a link): a job can make it tick
early, nothing more."""
FAST_POLL_S = 0.25
"""The watcher's interval while a run is between its requeue and its expedite (:func:`handing_back`)."""
FAST_WINDOW_S = 5.0
"""...and for this long after the wake file was touched: sacct, which :func:`handing_back` reads, can show the
requeue a second or more after slurmctld did it."""


def wake_line() -> str:
    """The teardown line that touches the wake file (the run dir comes from the template's setup lines)."""
    return f'    if [ -n "${{HPC_AGENT_RUN_DIR:-}}" ]; then : > "$HPC_AGENT_RUN_DIR/../{WAKE_FILE}" 2>/dev/null; fi'


def handing_back(latest_state: str, attempts: int, expedited) -> bool:
    """Whether a run's job is being requeued by Slurm and not yet expedited: sacct's newest attempt is
    REQUEUED and the attempt after it (index ``attempts``) has no expedite mark yet."""
    return latest_state == "REQUEUED" and attempts not in expedited


class WakeFile:
    """Notices when :data:`WAKE_FILE` in ``runs_root`` was touched since the last call."""

    def __init__(self, runs_root) -> None:
        import os

        self._path = os.path.join(str(runs_root), WAKE_FILE)
        self._seen = self._stamp()

    def _stamp(self):
        import os

        try:
            st = os.lstat(self._path)  # lstat: a link is not followed, only its own mtime counts
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def touched(self) -> bool:
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        return stamp is not None
