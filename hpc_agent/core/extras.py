"""Optional features and the pip extras that install them.

The core (submit, watch, diagnose, review, doctor and the training job) needs only the core
dependencies. Two features need more, declared as extras in pyproject.toml:

* ``sweep``: Optuna, for ``python -m hpc_agent.sweep``;
* ``tabular``: scikit-learn and imbalanced-learn, for the classifier workload.

Code that needs one of them imports it through :func:`require`, so a user without the extra gets
one line naming the extra and the command that installs it instead of a ModuleNotFoundError traceback.
"""
from __future__ import annotations

import sys
from types import ModuleType

# Top-level import name -> the distribution that provides it (what pip installs).
DISTRIBUTIONS = {
    "optuna": "optuna",
    "sklearn": "scikit-learn",
    "imblearn": "imbalanced-learn",
}


class MissingExtra(ImportError):
    """A feature's optional dependency is not installed; ``str()`` is the one-line message for the user."""

    def __init__(self, feature: str, distribution: str, extra: str):
        self.feature, self.distribution, self.extra = feature, distribution, extra
        super().__init__(f"{feature} needs {distribution}, which is not installed: "
                         f"pip install 'hpc_agent[{extra}]'")


def require(module_name: str, extra: str, feature: str) -> ModuleType:
    """Import and return ``module_name``, or raise :class:`MissingExtra` if its distribution is missing.

    Only a missing top-level package becomes MissingExtra: an ImportError from inside an installed
    package (a broken install, a bug) propagates unchanged so its real cause stays visible.
    """
    top = module_name.partition(".")[0]
    # __import__ is what an import statement runs (importlib.import_module bypasses parts of it, such
    # as the -X importtime report the login-node tests read).
    try:
        __import__(top)  # the distribution's package first: its absence is the missing extra
    except ModuleNotFoundError as exc:
        if exc.name != top:
            raise
        raise MissingExtra(feature, DISTRIBUTIONS.get(top, top), extra) from None
    __import__(module_name)
    return sys.modules[module_name]
