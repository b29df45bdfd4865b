"""``doctor``'s parts: the job's interpreter where it runs (``job_python``), a cluster profile against the live cluster
(``profile_fit``), this environment's prepared DeepSpeed ops (``envcheck``) and a dataset's ``data`` section
(``data_config``).
"""
