# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""registry_push on the local cluster: a pod runs from an image pushed in each compression.

The image is the smoke image (FROM the debootstrap base) saved by podman as a
docker-archive and pushed with our client, not podman: gzip/zstd/none to the
plain registry, gzip to the htpasswd+TLS one, gzip/zstd from the archive xz-compressed
(as the vendor ships MACA images); containerd pulls each.
"""

from __future__ import annotations

import os
import subprocess

import pytest

# the namespace fixture is reused from the smoke test
from test_cluster_smoke import _run_pod, namespace, smoke_context  # noqa: F401  # pylint: disable=unused-import

from ansible_collections.metax.gpu.plugins.module_utils.registry import api

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def smoke_archive(cluster, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("push-image")
    marker = smoke_context(ctx, cluster.base_image)
    local = "localhost/metax-gpu/push-smoke:%s" % marker
    archive = str(ctx / "image.tar")
    env = cluster.env
    try:
        for cmd in (["podman", "build", "--quiet", "--layers=false", "--network", "host", "-t", local, str(ctx)],
                    ["podman", "save", "--format", "docker-archive", "-o", archive, local]):
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                                 check=False)
            assert res.returncode == 0, res.stderr
    finally:
        subprocess.run(["podman", "rmi", "-f", local], env=env, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    return {"archive": archive, "marker": marker, "cache": str(ctx / "cache")}


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_pod_runs_from_pushed_image(cluster, smoke_archive, namespace, compression):  # noqa: F811
    result = api.push(api.PushRequest(src=smoke_archive["archive"], registry=cluster.registry + "/metax-gpu",
                                      repository="push-smoke", tag="%s-%s" % (smoke_archive["marker"], compression),
                                      plain_http=True, compression=compression, cache_dir=smoke_archive["cache"]))
    (art,) = result["artifacts"]
    assert art["changed"]
    log = _run_pod(cluster, namespace, "push-" + compression, art["ref"])
    assert "metax-smoke ok %s" % smoke_archive["marker"] in log, log
    again = api.push(api.PushRequest(src=smoke_archive["archive"], registry=cluster.registry + "/metax-gpu",
                                     repository="push-smoke", tag="%s-%s" % (smoke_archive["marker"], compression),
                                     plain_http=True, compression=compression, cache_dir=smoke_archive["cache"]))
    assert again["changed"] is False


def test_pod_runs_from_auth_registry(cluster, smoke_archive, namespace):  # noqa: F811
    result = api.push(api.PushRequest(src=smoke_archive["archive"], registry=cluster.registry_auth + "/metax-gpu",
                                      repository="push-smoke", tag=smoke_archive["marker"],
                                      username=cluster.registry_auth_user, password=cluster.registry_auth_password,
                                      ca_path=cluster.registry_auth_ca, cache_dir=smoke_archive["cache"]))
    log = _run_pod(cluster, namespace, "push-auth", result["artifacts"][0]["ref"], host_network=True)
    assert "metax-smoke ok %s" % smoke_archive["marker"] in log, log


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_pod_runs_from_pushed_xz_archive(cluster, smoke_archive, namespace, compression):  # noqa: F811
    """The vendor's way of shipping MACA images: the docker archive xz-compressed (multi-block, xz -T0)."""
    xz = smoke_archive["archive"] + ".xz"
    if not os.path.exists(xz):
        # level 1: the reader does not care how hard the blocks were packed, and the default level 6
        # cost CI 80 CPU-s for this one archive
        subprocess.run(["xz", "-1", "-T0", "-k", "--block-size=1MiB", smoke_archive["archive"]], check=True,
                       timeout=300)
    tag = "xz-%s-%s" % (smoke_archive["marker"], compression)
    result = api.push(api.PushRequest(src=xz, registry=cluster.registry + "/metax-gpu", tag=tag, plain_http=True,
                                      compression=compression, cache_dir=smoke_archive["cache"]))
    (art,) = result["artifacts"]
    # the image's own name (podman save's RepoTags) under DOMAIN/PROJECT
    assert art["changed"] and art["ref"] == "%s/metax-gpu/push-smoke:%s" % (cluster.registry, tag)
    log = _run_pod(cluster, namespace, "push-xz-" + compression, art["ref"])
    assert "metax-smoke ok %s" % smoke_archive["marker"] in log, log
