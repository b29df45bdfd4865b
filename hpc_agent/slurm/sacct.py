"""Parse ``sacct --parsable2`` text into records. Pure: text in, records out."""
from __future__ import annotations

from typing import Dict, List


def parse_parsable2(text: str) -> List[Dict[str, str]]:
    """Rows of ``sacct --parsable2`` output as dicts keyed by the header line's field names."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    return [dict(zip(header, line.split("|"))) for line in lines[1:]]


def job_state(records: List[Dict[str, str]], job_id: str) -> str | None:
    """State of the newest allocation row (not a step) of ``job_id``, or None if sacct has none."""
    rows = [r for r in records if r.get("JobID") == str(job_id)]
    if not rows:
        return None
    # sacct -D lists attempts oldest first; the last row is the newest attempt.
    return rows[-1].get("State", "").split(" ")[0] or None
