# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One role of the collection run on localhost by the real ansible-playbook, as the role tests do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys


def run_role(tmp_path, role, *flags, **extra):
    """ansible-playbook of ``metax.gpu.<role>`` with ``extra`` as extra vars (and ``flags``, e.g. --check);
    (the play's changed count, its output). Fails the test when the play fails."""
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [metax.gpu.%s]\n" % role)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps(extra), *flags, str(playbook)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(re.search(r"localhost\s*: ok=\d+\s+changed=(\d+)", proc.stdout).group(1)), proc.stdout
