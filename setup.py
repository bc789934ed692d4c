"""Package list for setuptools: the folders runtime/, kernels/, operator/ become pagoda.*.

A bare `operator` package would shadow Python's standard library, so every folder is
installed under the `pagoda.` prefix (see package-dir in pyproject.toml).
"""

import os

from setuptools import setup


def _packages() -> list[str]:
    found = []
    for folder in ("runtime", "kernels", "operator"):
        for root, _dirs, files in os.walk(folder):
            if "__init__.py" in files:
                found.append("pagoda." + root.replace(os.sep, "."))
    return found


setup(packages=_packages())
