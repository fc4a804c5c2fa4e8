from __future__ import annotations

import shutil

import pytest

from registry_fixtures import start_registry


@pytest.fixture
def registry(tmp_path):
    reg = start_registry(str(tmp_path / "registry"))
    yield reg
    reg.stop()


@pytest.fixture
def auth_registry(tmp_path):
    if not shutil.which("htpasswd"):
        pytest.skip("htpasswd not on PATH (Debian package apache2-utils, requirements/system.txt)")
    reg = start_registry(str(tmp_path / "registry-auth"), tls_auth=True)
    yield reg
    reg.stop()


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")
