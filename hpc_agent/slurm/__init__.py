"""Slurm: the one command adapter (cli) and pure parsing of its output (sacct)."""
