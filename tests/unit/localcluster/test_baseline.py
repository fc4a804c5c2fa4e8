# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The baseline rule (never remove what existed before) and teardown, half-started clusters included."""

from __future__ import annotations

from hypothesis import given, settings as hsettings, strategies as st

from localcluster import baseline
from localcluster.baseline import Baseline, Chain, Observed
from localcluster.settings import Settings

S = Settings()
ETC, KUBELET = S.kube_etc, S.kubelet_dir
OUR_CHAINS = (Chain("iptables", "nat", "METAX-GPU-CLUSTER"), Chain("iptables", "filter", "METAX-GPU-CLUSTER-IN"),
              Chain("iptables", "filter", "METAX-GPU-CLUSTER-FWD"))


def _up_made(netns=("metax-gpu-vm", "metax-gpu-vm-2", "cni-1234"), extra_present=(), etc=None, kubelet=None,
             chains=(), cgroups=None) -> Observed:
    """The machine as a full `up` leaves it (on top of a machine that had EXTRA_PRESENT)."""
    return Observed(
        present=frozenset((ETC, KUBELET, S.run_dir, S.sim_parent, "/var/lib/cni", "/run/netns", "/etc/cdi",
                           "/run/cdi", "/var/log/pods") + tuple(extra_present)),
        etc_files=etc or ("./.metax-gpu-cluster", "./admin.conf", "./manifests", "./manifests/kube-scheduler.yaml",
                          "./pki", "./pki/ca.crt"),
        kubelet_files=kubelet or ("./.metax-gpu-cluster", "./pods"),
        cgroups=cgroups or ("/sys/fs/cgroup/cpu/kubepods", "/sys/fs/cgroup/cpu/metax-gpu-vm",
                            "/sys/fs/cgroup/memory/metax-gpu-vm-2"),
        netns=tuple(netns),
        chains=OUR_CHAINS + (Chain("iptables", "nat", "KUBE-SERVICES"), Chain("ip6tables", "filter", "KUBE-FIREWALL"),
                             Chain("iptables", "nat", "CNI-abc")) + tuple(chains),
        links=("lo", "eth0", "metax-br0", "metax-v1", "metax-v2", "docker0", "metax-cni0"),
        mounts=("/", KUBELET, S.sim_root, S.state_dir + "/nodes/vm/kubelet/pods/x/volumes/y", "/proc"),
        ip_forward="1")


def test_fresh_machine_full_teardown():
    b = baseline.record(S, Observed(ip_forward="0"))
    plan = baseline.plan_down(S, b, _up_made())
    assert plan.netns == ("cni-1234", "metax-gpu-vm", "metax-gpu-vm-2")
    # the kubelet dir, the state, the run dir, the sim root; deepest first in each
    assert plan.unmount == (KUBELET, S.state_dir + "/nodes/vm/kubelet/pods/x/volumes/y", S.sim_root)
    assert plan.links == ("metax-br0", "metax-v1", "metax-v2", "metax-cni0")
    assert {c.name for c in plan.chains} == {"METAX-GPU-CLUSTER", "METAX-GPU-CLUSTER-IN", "METAX-GPU-CLUSTER-FWD",
                                             "KUBE-SERVICES", "KUBE-FIREWALL", "CNI-abc"}
    assert ETC in plan.paths and KUBELET in plan.paths and "/run/netns" in plan.paths
    assert plan.paths[-1] == S.state_dir
    assert plan.ip_forward == "0"
    assert baseline.violates_baseline(plan, b, S) == []


def test_what_existed_before_stays():
    """A machine with its own /etc/kubernetes files, KUBE-* chains, a cni- netns, kubepods and /run/netns."""
    before = Observed(present=frozenset((ETC, "/run/netns", "/var/lib/cni")), etc_files=("./audit", "./audit/p.yaml"),
                      cgroups=("/sys/fs/cgroup/cpu/kubepods",), netns=("cni-1234", "mine"),
                      chains=(Chain("iptables", "nat", "KUBE-SERVICES"),), ip_forward="1")
    b = baseline.record(S, before)
    assert b.existed == frozenset((ETC, "/run/netns", "/var/lib/cni"))
    seen = _up_made(netns=("cni-1234", "mine", "metax-gpu-vm", "cni-9"),
                    etc=("./.metax-gpu-cluster", "./admin.conf", "./audit", "./audit/p.yaml", "./pki", "./pki/ca.crt"))
    plan = baseline.plan_down(S, b, seen)
    assert plan.netns == ("cni-9", "metax-gpu-vm")
    assert ETC not in plan.paths and "/var/lib/cni" not in plan.paths and "/run/netns" not in plan.paths
    assert {ETC + "/admin.conf", ETC + "/pki", ETC + "/.metax-gpu-cluster"} <= set(plan.paths)
    assert ETC + "/pki/ca.crt" not in plan.paths  # its directory goes as a whole
    assert not any(p.startswith(ETC + "/audit") for p in plan.paths)
    assert "/sys/fs/cgroup/cpu/kubepods" not in plan.cgroups
    assert "KUBE-SERVICES" not in {c.name for c in plan.chains if c.tool == "iptables" and c.table == "nat"}
    assert baseline.violates_baseline(plan, b, S) == []


def test_half_started_cluster():
    """`up` stopped after the PKI and the first node's namespace: down removes exactly that much."""
    b = baseline.record(S, Observed(ip_forward="0"))
    seen = Observed(present=frozenset((ETC, "/run/netns", S.run_dir)), etc_files=("./.metax-gpu-cluster", "./pki"),
                    netns=("metax-gpu-vm",), chains=OUR_CHAINS[:1], links=("lo", "metax-br0", "metax-v1"),
                    ip_forward="1")
    plan = baseline.plan_down(S, b, seen)
    assert plan.netns == ("metax-gpu-vm",)
    assert plan.paths == (ETC, S.run_dir, "/run/netns", "/var/lib/cni/results/metax-gpu-cluster-*", S.state_dir)
    assert plan.links == ("metax-br0", "metax-v1") and plan.chains == OUR_CHAINS[:1]
    assert (plan.unmount, plan.cgroups) == ((), ())
    # down is safe to repeat: on the machine it left, nothing but the state dir remains to do
    again = baseline.plan_down(S, b, Observed(ip_forward="0"))
    assert (again.netns, again.links, again.chains, again.unmount) == ((), (), (), ())
    assert again.paths == ("/var/lib/cni/results/metax-gpu-cluster-*", S.state_dir)


def test_interrupted_before_the_baseline_was_complete():
    """No complete record: warned, and (as cluster.sh) nothing counts as pre-existing."""
    b = baseline.parse({"existed": ETC + "\n"})
    assert not b.complete
    plan = baseline.plan_down(S, b, _up_made())
    assert plan.warnings and "no baseline recorded" in plan.warnings[0]


def test_no_state_sweeps_only_our_names():
    seen = _up_made(netns=("metax-gpu-vm", "cni-1234", "other"))
    seen = Observed(**{**seen.__dict__, "state_exists": False, "etc_marker": False})
    plan = baseline.plan_down(S, None, seen)
    assert plan.netns == ("metax-gpu-vm",)
    assert plan.links == ("metax-br0", "metax-v1", "metax-v2")
    assert {c.name for c in plan.chains} == {"METAX-GPU-CLUSTER", "METAX-GPU-CLUSTER-IN", "METAX-GPU-CLUSTER-FWD"}
    assert plan.paths == () and plan.cgroups == ()
    marked = Observed(**{**seen.__dict__, "etc_marker": True, "kubelet_marker": True})
    assert baseline.plan_down(S, None, marked).paths == (ETC, KUBELET)


def test_complete_baseline_is_never_rerecorded():
    assert baseline.keep_existing(Baseline(complete=True))
    assert not baseline.keep_existing(Baseline(complete=False)) and not baseline.keep_existing(None)


def test_record_render_parse_round_trip():
    seen = Observed(present=frozenset(("/run/netns", ETC)), etc_files=("./b", "./a"), netns=("x",),
                    chains=(Chain("ip6tables", "nat", "KUBE-X"), Chain("iptables", "filter", "F"),
                            Chain("iptables", "nat", "N")), cgroups=("/sys/fs/cgroup/cpu/kubepods",),
                    ip_forward="1")
    b = baseline.record(S, seen)
    files = baseline.render(b, S)
    assert files["existed"] == "%s\n/run/netns\n" % ETC  # TRACKED_PATHS order
    assert files["etc-files"] == "./a\n./b\n"
    assert files["chains"] == "filter F\nnat N\n6nat KUBE-X\n"
    assert baseline.parse({**files, "complete": ""}) == b


paths = st.sampled_from([ETC, KUBELET, "/var/log/pods", "/var/log/containers", "/var/lib/cni", S.sim_parent,
                         S.run_dir, "/run/netns", "/run/containerd", "/etc/cdi", "/run/cdi"])
rel = st.lists(st.sampled_from(["./a", "./a/b", "./pki", "./pki/ca.crt", "./manifests", "./manifests/x.yaml"]),
               unique=True)
names = st.lists(st.sampled_from(["cni-1", "cni-2", "metax-gpu-vm", "metax-gpu-vm-2", "other"]), unique=True)
chain = st.builds(Chain, st.sampled_from(["iptables", "ip6tables"]), st.sampled_from(["filter", "nat"]),
                  st.sampled_from(["KUBE-SERVICES", "CNI-1", "METAX-GPU-CLUSTER", "DOCKER", "KUBE-FW"]))
cgroup = st.lists(st.sampled_from(["/sys/fs/cgroup/cpu/kubepods", "/sys/fs/cgroup/kubepods",
                                   "/sys/fs/cgroup/cpu/metax-gpu-vm"]), unique=True)
observed = st.builds(Observed, present=st.frozensets(paths), etc_files=rel.map(tuple), kubelet_files=rel.map(tuple),
                     cgroups=cgroup.map(tuple), netns=names.map(tuple), chains=st.lists(chain, unique=True).map(tuple),
                     ip_forward=st.sampled_from(["0", "1"]))


@hsettings(max_examples=300)
@given(before=observed, added=observed)
def test_never_removes_what_existed_before(before, added):
    """Whatever the machine had and whatever `up` added, down's plan touches nothing of the baseline."""
    b = baseline.record(S, before)
    now = Observed(present=before.present | added.present,
                   etc_files=tuple(sorted(set(before.etc_files) | set(added.etc_files))),
                   kubelet_files=tuple(sorted(set(before.kubelet_files) | set(added.kubelet_files))),
                   cgroups=tuple(sorted(set(before.cgroups) | set(added.cgroups))),
                   netns=tuple(sorted(set(before.netns) | set(added.netns))),
                   chains=tuple(dict.fromkeys(before.chains + added.chains)), ip_forward=added.ip_forward)
    plan = baseline.plan_down(S, b, now)
    assert baseline.violates_baseline(plan, b, S) == []
    # ... and what it removes is either new or carries the cluster's name
    assert all(n not in b.netns for n in plan.netns)
    assert plan.ip_forward == before.ip_forward
