from __future__ import annotations

import os
import shutil

import pytest

from registry_fixtures import REGISTRY_BIN, start_registry

needs_registry = pytest.mark.skipif(not os.path.exists(REGISTRY_BIN), reason="docker-registry not installed")


@pytest.fixture
def registry(tmp_path):
    if not os.path.exists(REGISTRY_BIN):
        pytest.skip("docker-registry not installed")
    reg = start_registry(str(tmp_path / "registry"))
    yield reg
    reg.stop()


@pytest.fixture
def auth_registry(tmp_path):
    if not os.path.exists(REGISTRY_BIN) or not shutil.which("htpasswd"):
        pytest.skip("docker-registry or htpasswd not installed")
    reg = start_registry(str(tmp_path / "registry-auth"), tls_auth=True)
    yield reg
    reg.stop()


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")
