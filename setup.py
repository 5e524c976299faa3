"""The packages are found, not listed: every package under hsdump/ (a folder with an
__init__.py), plus hsdump.conf, which pyproject.toml maps to the top-level conf/ (in the wheel
a copy of it, so the installed command finds its Hydra configs from any folder).
tests/test_package.py checks the wheel holds every package of the checkout."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hsdump", "hsdump.*"]), "hsdump.conf"])
