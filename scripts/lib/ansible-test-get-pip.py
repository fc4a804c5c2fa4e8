"""Offline stand-in for the pip bootstrap script ansible-test downloads.

ansible-test creates its sanity virtualenvs without pip and fetches
``get-pip.py`` from a host this network cannot reach. This script does the
same job from what is here: ``ensurepip`` (standard library) installs the
bundled pip, then pip installs the requested packages from PyPI.
scripts/run-tests.sh places it in ansible-test's cache.
"""
import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main(argv):
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
    args = [a for a in argv if a not in GET_PIP_ONLY]
    packages = [a for a in args if not a.startswith("-")]
    if packages:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check"] + args)


if __name__ == "__main__":
    main(sys.argv[1:])
