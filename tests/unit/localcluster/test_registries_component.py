# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The registries component's whole lifecycle with the real docker-registry, on free ports in a temporary state.

The pattern every component follows in phase 2: up() makes what it owns and
writes files() through the Host, starts its processes; ready() asks the real
programs; down() stops only what it started. A second up() changes nothing.
"""

from __future__ import annotations

import os
import time

import pytest
from ports import free_port

from localcluster import registries
from localcluster.component import Inputs
from localcluster.host import LocalHost
from localcluster.settings import Settings


@pytest.fixture
def component(tmp_path):
    p, a = free_port(), free_port()
    settings = Settings(state_dir=str(tmp_path / "state"), registry_port=p, registry_auth_port=a,
                        registry="127.0.0.1:%d" % p, registry_auth="127.0.0.1:%d" % a)
    host = LocalHost(settings.pids, settings.logs, grace=5.0)
    comp = registries.RegistriesComponent(settings, Inputs())
    yield comp, host
    comp.down(host)


def _wait_ready(comp, host) -> bool:
    deadline = time.monotonic() + 60          # generous: a loaded CI machine starts the registries slowly
    while time.monotonic() < deadline:
        if comp.ready(host):
            return True
        time.sleep(0.1)
    return False


def test_up_ready_down(component):
    comp, host = component
    s = comp.settings
    assert not comp.ready(host)
    comp.up(host)
    assert _wait_ready(comp, host), open(s.logs + "/registry-auth.log", encoding="utf-8").read()
    a = s.state_dir + "/registry-auth"
    # the TLS registry refuses anonymous and wrong credentials (the real htpasswd check)
    assert host.http_status("https://%s/v2/" % s.registry_auth, cafile=a + "/tls.crt") == 401
    assert host.http_status("https://%s/v2/" % s.registry_auth, cafile=a + "/tls.crt", user=s.registry_user,
                            password="wrong") == 401
    assert oct(os.stat(a + "/tls.key").st_mode & 0o777) == oct(0o600)
    assert open("%s/certs.d/%s/ca.crt" % (a, s.registry_auth), "rb").read() == open(a + "/tls.crt", "rb").read()
    pids = (host.pid("registry"), host.pid("registry-auth"))
    password = open(a + "/password", encoding="utf-8").read()

    comp.up(host)  # again: nothing made anew, nothing restarted
    assert (host.pid("registry"), host.pid("registry-auth")) == pids
    assert open(a + "/password", encoding="utf-8").read() == password

    comp.down(host)
    assert not host.running("registry") and not host.running("registry-auth")
    assert host.http_status("http://%s/v2/" % s.registry) == 0


def test_up_writes_what_files_says(component):
    comp, host = component
    comp.up(host)
    s = comp.settings
    with open(s.state_dir + "/registry/secret", encoding="utf-8") as fh:
        secret = fh.read().strip()
    with open(s.state_dir + "/registry/config.yml", encoding="utf-8") as fh:
        assert fh.read() == registries.render(registries.plain(s, secret))
