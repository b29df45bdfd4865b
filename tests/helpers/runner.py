"""``python tests/helpers/runner.py CONFIG RUN_DIR``: ``launch.train`` with the real workloads, or the
stand-in of ``standin_workload.py`` (as ``launch.workloads.registry``) when the workloads are not importable (or
``HPC_AGENT_TEST_STANDIN=1``)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _install_standin() -> None:
    spec = importlib.util.spec_from_file_location("launch.workloads.registry", HERE / "standin_workload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["launch.workloads.registry"] = module


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))
    if os.environ.get("HPC_AGENT_TEST_STANDIN") == "1":
        _install_standin()
    else:
        try:
            import launch.workloads.registry  # noqa: F401
        except ImportError:
            _install_standin()
    from launch.train import cli

    sys.exit(cli())
