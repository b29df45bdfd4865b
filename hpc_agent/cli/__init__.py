"""What every command shares: ``--version``, ``-v``/``-q`` and ``--clusters`` (``flags``) and the commands' exit codes
(``exit_status``). The commands themselves are the modules at the top of ``hpc_agent/``.
"""
