"""Run a module's main() in-process, ansible-test unit style.

Modules under test exit through exit_json/fail_json; this turns those exits
into return values so tests can assert on ``changed``, ``diff`` and check
mode without a subprocess.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Tuple
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class _Exit(Exception):
    def __init__(self, result: Dict[str, Any], failed: bool) -> None:
        super().__init__(result)
        self.result = result
        self.failed = failed


def _exit_json(self, **kwargs):  # pylint: disable=unused-argument
    kwargs.setdefault("changed", False)
    raise _Exit(kwargs, failed=False)


def _fail_json(self, msg, **kwargs):  # pylint: disable=unused-argument
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise _Exit(kwargs, failed=True)


def run_module(module, args: Dict[str, Any], check_mode: bool = False, diff: bool = False) -> Tuple[bool, Dict[str, Any]]:
    """Run ``module.main()`` with ``args``; returns (failed, result).

    The result went through JSON, as Ansible would send it back.
    """
    full = dict(args)
    full["_ansible_check_mode"] = check_mode
    full["_ansible_diff"] = diff
    with patch_module_args(full), \
            mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json), \
            mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json):
        try:
            module.main()
        except _Exit as done:
            return done.failed, json.loads(json.dumps(done.result))
    raise AssertionError("%s.main() returned without exit_json or fail_json" % module.__name__)


def tree(root: str) -> Dict[str, Any]:
    """Every path under a root -> its content, link target or 'dir': what 'changes nothing' is measured against."""
    out: Dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                out[path] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[path] = handle.read()
            else:
                out[path] = "dir"
    return out
