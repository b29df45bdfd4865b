"""The ledger's tables (``hpc_agent/state/ledger.py`` creates them, idempotently, whenever it opens a ledger).

The statements are ``CREATE ... IF NOT EXISTS``: opening an existing ledger changes nothing. There are no
migrations, so a column added to an existing table would need one.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    run_dir     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    phase       TEXT NOT NULL DEFAULT 'submitting',
    updated_at  REAL
);
CREATE TABLE IF NOT EXISTS submissions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL REFERENCES runs(run_id),
    executor     TEXT NOT NULL,
    config_path  TEXT NOT NULL,
    reason       TEXT NOT NULL,
    intent_at    REAL NOT NULL,
    job_id       TEXT,
    submitted_at REAL,
    error        TEXT
);
CREATE INDEX IF NOT EXISTS submissions_run ON submissions(run_id);
-- One row per decided attempt; the UNIQUE key makes deciding idempotent across watcher restarts.
CREATE TABLE IF NOT EXISTS decisions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL REFERENCES runs(run_id),
    job_id       TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    at           REAL NOT NULL,
    cause        TEXT NOT NULL,
    action       TEXT NOT NULL,
    reason       TEXT NOT NULL,
    patch        TEXT NOT NULL DEFAULT '{}',
    evidence     TEXT NOT NULL DEFAULT '[]',
    ckpt_step    INTEGER,
    decision     TEXT NOT NULL DEFAULT '{}',
    UNIQUE(job_id, attempt)
);
-- Expedites already sent (scontrol update StartTime=now), once per attempt.
CREATE TABLE IF NOT EXISTS expedites (
    job_id   TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    at       REAL NOT NULL,
    PRIMARY KEY(job_id, attempt)
);
-- The effect journal (hpc_agent/state/journal.py): what a decision asks to be done, written in the decision's
-- transaction, carried out afterwards and marked done; a pending row is carried out on the next tick.
CREATE TABLE IF NOT EXISTS effects (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           TEXT NOT NULL,
    kind             TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    args             TEXT NOT NULL DEFAULT '{}',
    after_submission INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending',
    tries            INTEGER NOT NULL DEFAULT 0,
    done_at          REAL,
    result           TEXT
);
CREATE INDEX IF NOT EXISTS effects_status ON effects(status, run_id);
-- The audit trail; events.jsonl is written from it (each line carries its seq, so a crash between the
-- append and the mark never writes a line twice) and can be rebuilt from it.
CREATE TABLE IF NOT EXISTS audit (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   TEXT NOT NULL,
    at       REAL NOT NULL,
    record   TEXT NOT NULL,
    written  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS audit_unwritten ON audit(written, run_id);
-- Hang suspicions (hpc_agent/watcher/follow_hang.py): stacks asked of a running attempt, one row per attempt.
CREATE TABLE IF NOT EXISTS hang_suspicions (
    job_id    TEXT NOT NULL,
    attempt   INTEGER NOT NULL,
    asked_at  REAL NOT NULL,
    marks     TEXT NOT NULL DEFAULT '{}',
    verdict   TEXT NOT NULL DEFAULT '{}',
    active    INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY(job_id, attempt)
);
-- Notifications (hpc_agent/watcher/notifier.py): a row per event, written before it is sent (with the audit cursor it
-- was derived up to), so a restarted watcher never sends one twice.
CREATE TABLE IF NOT EXISTS notifications (
    key      TEXT PRIMARY KEY,
    run_id   TEXT NOT NULL,
    event    TEXT NOT NULL,
    at       REAL NOT NULL,
    status   TEXT NOT NULL DEFAULT 'sending',
    result   TEXT
);
CREATE TABLE IF NOT EXISTS notify_cursor (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    seq  INTEGER NOT NULL
);
-- The config the watcher acts on (hpc_agent/state/run_config.py): every version of a run's config, as YAML, with
-- its SHA-256. Written by submit (the config it submits), by the watcher (each resubmission's or exclusion's
-- patch) and by the watcher's ingest of the job's own repairs (allow-listed keys only). The run directory's
-- config.yaml is the job's copy; the watcher never acts on it.
CREATE TABLE IF NOT EXISTS run_configs (
    run_id   TEXT NOT NULL,
    version  INTEGER NOT NULL,
    at       REAL NOT NULL,
    source   TEXT NOT NULL,
    yaml     TEXT NOT NULL,
    sha256   TEXT NOT NULL,
    PRIMARY KEY(run_id, version)
);
-- One watcher per runs root: a lease with a heartbeat (hpc_agent/state/journal.py WatcherLease).
CREATE TABLE IF NOT EXISTS watcher_lease (
    one        INTEGER PRIMARY KEY CHECK (one = 1),
    holder     TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    heartbeat  REAL NOT NULL,
    ttl        REAL NOT NULL
);
"""
