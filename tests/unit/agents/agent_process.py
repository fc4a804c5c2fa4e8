"""Run an agent as its own process, with the collection importable as in the image."""
from __future__ import annotations

import os
import subprocess
import sys


def agent_env(**extra):
    from ansible_collections.metax.gpu.plugins.module_utils import host
    collections = os.path.abspath(os.path.join(os.path.dirname(host.__file__), *[".."] * 5))
    env = dict(os.environ, PYTHONPATH=collections, NODE_NAME="")
    env.update(extra)
    return env


def run_agent(module, *args, timeout=120):
    # generous: the agents import grpc and the kubernetes client, slow to start on a loaded CI machine
    return subprocess.run([sys.executable, "-m", module] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, check=False, env=agent_env())
