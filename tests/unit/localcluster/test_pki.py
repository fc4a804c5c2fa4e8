# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The PKI plan: subjects, usages, SANs; its openssl commands make certificates that say so."""

from __future__ import annotations

import subprocess

from localcluster import pki
from localcluster.pki import Usage


def test_plan_names_and_order(three):
    assert [c.name for c in pki.plan(three)] == [
        "apiserver", "apiserver-kubelet-client", "admin", "controller-manager", "scheduler", "kube-proxy",
        "kubelet-client-vm", "kubelet-vm", "kubelet-client-vm-2", "kubelet-vm-2", "kubelet-client-vm-3",
        "kubelet-vm-3"]


def test_apiserver_names_every_address_it_is_reached_at():
    sans = pki.apiserver_sans()
    # the host (loopback), pods (the service IP) and the nodes (the bridge address)
    assert {"IP:127.0.0.1", "IP:10.96.0.1", "IP:10.250.0.1"} <= set(sans)
    assert "DNS:kubernetes.default.svc.cluster.local" in sans


def test_kubelet_serving_cert_lists_its_node_ip(three):
    certs = {c.name: c for c in pki.plan(three)}
    assert certs["kubelet-vm-3"].sans == ("DNS:vm-3", "DNS:localhost", "IP:127.0.0.1", "IP:10.250.0.13")
    assert certs["kubelet-vm-3"].usage is Usage.SERVER
    client = certs["kubelet-client-vm-2"]
    assert (client.subject, client.usage, client.sans) == ("/O=system:nodes/CN=system:node:vm-2", Usage.CLIENT, ())
    assert certs["admin"].subject == "/O=system:masters/CN=kubernetes-admin"
    assert certs["kube-proxy"].subject == "/CN=system:kube-proxy"


def test_extfile():
    spec = pki.CertSpec("x", "x", "", Usage.BOTH, ("DNS:a", "IP:1.2.3.4"))
    assert spec.extfile() == ("basicConstraints=critical,CA:FALSE\n"
                              "keyUsage=critical,digitalSignature,keyEncipherment\n"
                              "extendedKeyUsage=serverAuth,clientAuth\n"
                              "subjectAltName=DNS:a,IP:1.2.3.4\n")
    assert "subjectAltName" not in pki.CertSpec("y", "y", "", Usage.CLIENT).extfile()


def test_commands_make_what_the_plan_says(tmp_path, three):
    """The real openssl, in a temporary PKI dir: CA, one kubelet serving cert, the service-account pair."""
    d = str(tmp_path)
    for argv in pki.ca_commands(d) + pki.service_account_commands(d):
        subprocess.run(argv, check=True, capture_output=True)
    spec = next(c for c in pki.plan(three) if c.name == "kubelet-vm-2")
    ext = tmp_path / "ext"
    ext.write_text(spec.extfile())
    for argv in spec.commands(d, str(ext)):
        subprocess.run(argv, check=True, capture_output=True)
    text = subprocess.run(["openssl", "x509", "-in", d + "/kubelet-vm-2.crt", "-noout", "-text"], check=True,
                          capture_output=True, text=True).stdout
    assert "DNS:vm-2, DNS:localhost, IP Address:127.0.0.1, IP Address:10.250.0.12" in text
    assert "TLS Web Server Authentication" in text and "CA:FALSE" in text and "prime256v1" in text
    subprocess.run(["openssl", "verify", "-CAfile", d + "/ca.crt", d + "/kubelet-vm-2.crt"], check=True,
                   capture_output=True)
    assert "Private-Key: (2048 bit" in subprocess.run(["openssl", "rsa", "-in", d + "/sa.key", "-noout", "-text"],
                                                      check=True, capture_output=True, text=True).stdout
