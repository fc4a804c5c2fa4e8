# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Generated configuration files: what each says, parsed by its real parser (and containerd's own)."""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import subprocess
import tomllib

import pytest
import yaml

from localcluster import containerd, kube_proxy, kubelet, network, registries, scheduler
from localcluster.component import Write
from localcluster.settings import HOST_IP

CACHE = os.environ.get("METAX_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "metax-gpu")


# ---------------------------------------------------------------- kubelet
def test_kubelet_config_per_node(settings, three):
    docs = [yaml.safe_load(kubelet.render(kubelet.config_for(settings, n))) for n in three]
    assert [d["address"] for d in docs] == [d["healthzBindAddress"] for d in docs] == [
        "10.250.0.11", "10.250.0.12", "10.250.0.13"]
    assert [d["podCIDR"] for d in docs] == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"]
    # two kubelets on one cgroup root remove each other's pod cgroups
    assert len({d["cgroupRoot"] for d in docs}) == 3
    # only the control-plane node runs the machine's static pods
    assert [d.get("staticPodPath") for d in docs] == [settings.manifests, None, None]
    d = docs[1]
    assert d["tlsCertFile"] == settings.pki + "/kubelet-vm-2.crt"
    assert d["containerRuntimeEndpoint"] == "unix://%s/nodes/vm-2/containerd.sock" % settings.run_dir
    assert (d["readOnlyPort"], d["authentication"]["anonymous"]["enabled"], d["authorization"]["mode"]) == (
        0, False, "Webhook")
    assert (d["cgroupDriver"], d["failSwapOn"], d["failCgroupV1"]) == ("cgroupfs", False, False)


def test_kubelet_config_keeps_cluster_sh_blank_line(settings, three):
    """cluster.sh leaves an empty line where a node has no staticPodPath; byte-equivalence keeps it."""
    text = kubelet.render(kubelet.config_for(settings, three[1]))
    assert "imageServiceEndpoint: unix://%s/nodes/vm-2/containerd.sock\n\npodLogsDir" % settings.run_dir in text


def test_kubelet_process(settings, three):
    spec = kubelet.process(settings, three[2], "/bin/kubelet", 42)
    assert spec.wrap == ("nsenter", "-t", "42", "-m", "-n", "--")
    assert "--node-ip=10.250.0.13" in spec.argv and "--hostname-override=vm-3" in spec.argv
    assert spec.config_files == (settings.state_dir + "/nodes/vm-3/kubelet-config.yaml",)


# ---------------------------------------------------------------- containerd
def _cfg(settings, node, version):
    return containerd.config_for(settings, node, "/usr/sbin/runc", "s3cret", version)


def test_containerd_v3(settings, three):
    doc = tomllib.loads(containerd.render(_cfg(settings, three[1], 3)))
    assert doc["version"] == 3
    assert doc["grpc"]["address"] == settings.run_dir + "/nodes/vm-2/containerd.sock"
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == settings.pause_image
    assert images["registry"]["config_path"] == settings.state_dir + "/containerd-certs.d"
    assert set(images["registry"]["configs"]) == {"127.0.0.1:5443", HOST_IP + ":5443"}
    assert images["registry"]["configs"]["127.0.0.1:5443"]["auth"] == {"username": "metax", "password": "s3cret"}
    runtime = doc["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert runtime["cni"]["conf_dir"] == settings.state_dir + "/nodes/vm-2/cni/net.d"
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "Root": settings.run_dir + "/nodes/vm-2/runc",
                               "SystemdCgroup": False}


def test_containerd_v2(settings, three):
    doc = tomllib.loads(containerd.render(_cfg(settings, three[0], 2)))
    assert doc["version"] == 2
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == settings.pause_image
    assert cri["restrict_oom_score_adj"] is True
    # containerd 1.6 has no CDI
    assert "enable_cdi" not in cri and "cdi_spec_dirs" not in cri
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": settings.state_dir + "/nodes/vm/cni/net.d",
                          "max_conf_num": 1}
    assert cri["registry"]["configs"][HOST_IP + ":5443"]["auth"]["password"] == "s3cret"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert "io.containerd.nri.v1.nri" not in doc["disabled_plugins"]


def test_containerd_unknown_version(settings, three):
    with pytest.raises(ValueError, match="only 2"):
        containerd.render(_cfg(settings, three[0], 4))


def _dump(binary: str, config: str) -> subprocess.CompletedProcess:
    # `config dump` loads and prints the effective configuration; it starts nothing
    return subprocess.run([binary, "--config", config, "config", "dump"], capture_output=True, text=True,
                          timeout=60, check=True)


def test_containerd_1_6_reads_the_v2_config(settings, three, tmp_path):
    """Debian's containerd 1.6 (requirements/system.txt: deb containerd) takes version 2 without complaint."""
    path = tmp_path / "config.toml"
    path.write_text(containerd.render(_cfg(settings, three[0], 2)))
    proc = _dump("/usr/bin/containerd", str(path))
    assert "level=warning" not in proc.stderr and "unknown" not in proc.stderr.lower()
    eff = tomllib.loads(proc.stdout)["plugins"]["io.containerd.grpc.v1.cri"]
    assert eff["sandbox_image"] == settings.pause_image
    assert eff["registry"]["config_path"] == settings.state_dir + "/containerd-certs.d"
    assert eff["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"


def test_containerd_2_reads_the_v3_config(settings, three, tmp_path):
    """The cluster's containerd 2 (the go-built one of requirements/system.txt) reads version 3.

    Found here: containerd 2.4 ignores ``enable_cdi`` (CDI is always on in 2.x) and migrates version 3 to its
    version 4 on load. cluster.sh writes both; phase 2 drops the key and writes version 4
    (docs/local-cluster.md), so the only unknown key allowed today is that one.
    """
    binaries = sorted(glob.glob(os.path.join(CACHE, "containerd", "v2.*", "bin", "containerd")))
    assert binaries, "the go-built containerd 2 (scripts/cluster/build-containerd.sh) is not in %s" % CACHE
    path = tmp_path / "config.toml"
    path.write_text(containerd.render(_cfg(settings, three[1], 3)))
    proc = _dump(binaries[-1], str(path))
    unknown = [line for line in proc.stderr.splitlines() if "unknown key" in line.lower()]
    assert all("key=enable_cdi " in line for line in unknown), unknown
    eff = tomllib.loads(proc.stdout)["plugins"]
    assert eff["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == settings.pause_image
    assert eff["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert eff["io.containerd.cri.v1.runtime"]["cni"]["bin_dirs"] == ["/usr/lib/cni"]
    assert eff["io.containerd.cri.v1.images"]["registry"]["configs"]["127.0.0.1:5443"]["auth"]["username"] == "metax"


# ---------------------------------------------------------------- CNI and network
def test_cni_conflist(settings, three):
    f = network.cni_file(settings, three[2])
    assert f.path == settings.state_dir + "/nodes/vm-3/cni/net.d/10-metax-gpu-cluster.conflist"
    doc = json.loads(f.content)
    plugin = doc["plugins"][0]
    assert (doc["name"], plugin["type"], plugin["bridge"], plugin["ipMasq"]) == (
        "metax-gpu-cluster", "bridge", "metax-cni0", False)
    rng = plugin["ipam"]["ranges"][0][0]
    assert rng == {"subnet": "10.244.2.0/24", "gateway": "10.244.2.1"}
    assert ipaddress.IPv4Address(rng["gateway"]) in ipaddress.IPv4Network(rng["subnet"])
    assert plugin["ipam"]["dataDir"] == settings.state_dir + "/nodes/vm-3/cni/ipam"


def test_routes_each_pod_cidr_to_its_node(three):
    routes = network.routes(three)
    assert len(routes) == 3 + 3 * 2
    host = [(r.dest, r.via) for r in routes if not r.netns]
    assert host == [(n.pod_cidr, n.ip) for n in three]
    in_vm2 = {r.dest: r.via for r in routes if r.netns == "metax-gpu-vm-2"}
    assert in_vm2 == {"10.244.0.0/24": "10.250.0.11", "10.244.2.0/24": "10.250.0.13"}
    assert routes[1].argv() == ["ip", "-n", "metax-gpu-vm", "route", "replace", "10.244.1.0/24", "via",
                                "10.250.0.12", "dev", "eth0"]


def test_iptables_chains(settings):
    chains = {c.name: c for c in network.chains(settings)}
    assert network.listed(chains["METAX-GPU-CLUSTER-IN"])[-1] == (
        "-A METAX-GPU-CLUSTER-IN -p tcp -m multiport --dports 6443,5000,5443 -j DROP")
    assert chains["METAX-GPU-CLUSTER"].table == "nat" and chains["METAX-GPU-CLUSTER"].hook == "OUTPUT"
    assert "127.0.0.1:6443" in chains["METAX-GPU-CLUSTER"].rules[0]


# ---------------------------------------------------------------- registries
def test_registry_configs(settings):
    plain = yaml.safe_load(registries.render(registries.plain(settings, "abc")))
    auth = yaml.safe_load(registries.render(registries.auth(settings, "def")))
    assert plain["http"] == {"addr": ":5000", "secret": "abc"}
    assert "auth" not in plain
    assert auth["http"]["addr"] == ":5443" and auth["http"]["tls"]["key"] == settings.state_dir + "/registry-auth/tls.key"
    assert auth["auth"]["htpasswd"] == {"realm": "metax-gpu-registry",
                                        "path": settings.state_dir + "/registry-auth/htpasswd"}
    assert registries.config_file(registries.auth(settings, "x")).mode == 0o600
    assert registries.process(registries.auth(settings, "x")).config_files[1:] == (
        settings.state_dir + "/registry-auth/htpasswd", settings.state_dir + "/registry-auth/tls.crt")


def test_registry_hosts(settings):
    files = {f.path.rsplit("/", 2)[-2]: tomllib.loads(f.content) for f in registries.host_files(settings)}
    assert sorted(files) == sorted(["127.0.0.1:5000", "localhost:5000", "10.250.0.1:5000", "127.0.0.1:5443",
                                    "10.250.0.1:5443"])
    # the nodes reach both registries on the bridge address, whatever name the image carries
    assert files["localhost:5000"]["server"] == "http://10.250.0.1:5000"
    tls = files["127.0.0.1:5443"]["host"]["https://10.250.0.1:5443"]
    assert tls == {"capabilities": ["pull", "resolve"], "ca": settings.state_dir + "/registry-auth/tls.crt"}
    assert "ca" not in files["127.0.0.1:5000"]["host"]["http://10.250.0.1:5000"]


# ---------------------------------------------------------------- scheduler, kube-proxy
def test_scheduler_manifest(settings):
    f = scheduler.manifest_file(settings)
    assert f.write is Write.IF_ABSENT  # scheduler_extender patches it later
    pod = yaml.safe_load(f.content)
    c = pod["spec"]["containers"][0]
    assert c["image"] == settings.scheduler_image
    assert pod["spec"]["hostNetwork"] is True
    assert {c[p]["httpGet"]["port"] for p in ("livenessProbe", "readinessProbe", "startupProbe")} == {10259}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Ready follows /livez within a second of the start (kubeadm's 10 s startupProbe period cost every
    # restart 10-20 s), with kubeadm's budget of 240 s before the kubelet gives up on the start
    start = c["startupProbe"]
    assert (start["initialDelaySeconds"], start["periodSeconds"]) == (1, 1)
    assert start["periodSeconds"] * start["failureThreshold"] == 240
    assert "--kubeconfig=/etc/kubernetes/scheduler.conf" in c["command"]


def test_kube_proxy_config(settings, three):
    f = kube_proxy.config_file(settings, three[1])
    assert f.write is Write.IF_CHANGED  # kube-proxy exits when its config file is written to
    doc = yaml.safe_load(f.content)
    assert (doc["mode"], doc["hostnameOverride"], doc["bindAddress"], doc["healthzBindAddress"]) == (
        "iptables", "vm-2", "10.250.0.12", "10.250.0.12:10256")
    assert doc["iptables"]["masqueradeAll"] is True and doc["clusterCIDR"] == "10.244.0.0/16"
    assert doc["clientConnection"]["kubeconfig"] == settings.state_dir + "/kube-proxy.conf"
