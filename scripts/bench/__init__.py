"""The benchmarks, one module each, run from the checkout's root as ``python -m scripts.bench.<name> --help``.

Each writes one JSON result (``results/<name>.json`` or ``results/gpu/``; ``docs/benchmarks.md`` has the rules
every benchmark follows, the current figures and the commits of older runs it quotes). They import each other as
modules of this package (``from scripts.bench.recovery import ...``); the pure helpers are tested in
``tests/unit/test_bench_*.py``.
"""
