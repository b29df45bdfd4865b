"""From a laptop: every command on a login node over ssh (``ssh``), ``submit --remote`` validating here first
(``ssh_submit``), and the incremental TensorBoard pull for ``review --remote`` (``tb_pull``).
"""
