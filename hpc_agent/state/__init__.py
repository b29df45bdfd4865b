"""The watcher's state, with SQLite as the truth: the ledger (``ledger``, ``ledger_schema``), the one run state machine
(``lifecycle``), the effect journal and lease (``journal``), the audit trail (``audit``) and the kill switch
(``killswitch``). Only the watcher's user writes it; the job never imports it.
"""
