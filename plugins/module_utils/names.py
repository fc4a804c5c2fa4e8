# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Names the cluster sees: the one place they are defined (DESIGN section 3).

Resource, label and annotation keys, ConfigMap and image names are contracts
with the kubelet, the scheduler, HAMi and administrators' selectors. Every
other module imports them from here.
"""

from __future__ import annotations

from typing import Dict, Tuple

DOMAIN = "metax-tech.com"
PREFIX = DOMAIN + "/"

# Extended resource: one device per GPU, or per VF when vfnum > 1.
RESOURCE_NAME = PREFIX + "gpu"

# Node labels published by gpu-label (manual Table 2.7); selectors in
# administrators' manifests and HAMi depend on them.
LABEL_PREFIX = PREFIX
LABEL_GPU_INSTALLED = LABEL_PREFIX + "gpu.installed"
LABEL_DRIVER_READY = LABEL_PREFIX + "driver.ready"
LABEL_DRIVER_MAJOR = LABEL_PREFIX + "gpu.driver.major"
LABEL_DRIVER_MINOR = LABEL_PREFIX + "gpu.driver.minor"
LABEL_DRIVER_PATCH = LABEL_PREFIX + "gpu.driver.patch"
LABEL_DRIVER_MODE = LABEL_PREFIX + "gpu.driver.mode"
LABEL_GPU_FAMILY = LABEL_PREFIX + "gpu.family"
LABEL_GPU_MEMORY = LABEL_PREFIX + "gpu.memory"
LABEL_GPU_PRODUCT = LABEL_PREFIX + "gpu.product"
LABEL_GPU_SRIOV = LABEL_PREFIX + "gpu.sriov"
LABEL_GPU_VFNUM = LABEL_PREFIX + "gpu.vfnum"
LABEL_GPU_COUNT = LABEL_PREFIX + "gpu.count"     # extra: physical GPUs on the node
# Every label gpu-label sets, so it can also remove the ones it no longer sets.
GPU_LABEL_KEYS = (LABEL_GPU_INSTALLED, LABEL_DRIVER_READY, LABEL_DRIVER_MAJOR, LABEL_DRIVER_MINOR, LABEL_DRIVER_PATCH,
                  LABEL_DRIVER_MODE, LABEL_GPU_FAMILY, LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT, LABEL_GPU_SRIOV,
                  LABEL_GPU_VFNUM, LABEL_GPU_COUNT)

# Node annotations published by gpu-device.
ANNOTATION_SCORES = PREFIX + "gpu.topology.scores"
ANNOTATION_LOSSES = PREFIX + "gpu.topology.losses"
ANNOTATION_DEVICES = PREFIX + "gpu.devices"
ANNOTATION_KEYS = (ANNOTATION_SCORES, ANNOTATION_LOSSES, ANNOTATION_DEVICES)
# GPU health (issue 42, docs/health.md), written by gpu-device: the node condition
# (failing GPUs and signals in its message), the quarantine taint a policy row may
# ask for, and the ConfigMap holding the cluster's health policy table.
CONDITION_GPU_HEALTHY = "MetaXGPUHealthy"
TAINT_GPU_HEALTH = PREFIX + "gpu-health"
HEALTH_POLICY_CONFIGMAP = "metax-gpu-health-policy"
# The remediation ladder (issue 42, health/ladder.py), climbed by driver-manager on
# its node: its own condition (each step and its result in the message), the
# ladder's state as JSON (which step, since when, whose cordon), the reboot request
# a reboot tool can read (kured: docs/health.md), and its budget's Leases
# <prefix>-<i> (maxNodes nodes in remediation at once).
CONDITION_GPU_REMEDIATION = "MetaXGPURemediation"
ANNOTATION_HEALTH_REMEDIATION = PREFIX + "gpu-health.remediation"
ANNOTATION_REBOOT_REQUIRED = PREFIX + "gpu-health.reboot-required"
HEALTH_SLOT_PREFIX = "metax-health-slot"

# Label on every Lease of a slot pool (kube/slots.py): one list call sees the pool.
LABEL_SLOT_POOL = PREFIX + "slot-pool"

# Namespace the collection installs its components into (charts, agents).
NAMESPACE = "metax-gpu"

# ConfigMap holding gpu-aware's weights (manual Table 2.5).
GPU_AWARE_CONFIGMAP = "gpu-aware-plugin"

# Day-two operations (issue 16). Ours, not gpu-label's: the upgrade never
# removes these with the metax-tech.com/ labels it strips.
LABEL_DRIVER_UPGRADE_STATE = PREFIX + "driver.upgrade-state"     # driver_upgrade.yml node state
LABEL_DRIVER_UPGRADE_SKIP = PREFIX + "driver.upgrade.skip"       # "true": the upgrade leaves the node alone
LABEL_AGENTS_PAUSED = PREFIX + "agents.paused"                   # node agents' affinity excludes the node
ANNOTATION_PRE_CORDONED = PREFIX + "driver.upgrade.pre-cordoned"  # the admin's cordon, never undone
DRIVER_UPGRADE_STATES = ("upgrade-required", "cordoned", "paused", "pods-evicted", "driver-installed",
                         "validating", "done", "failed", "rolled-back")
# How the rollout planner (driver/rollout.py) reads those states: the operator's
# controller sets upgrade-required (and cordons); the node's procedure moves on
# through the others to done (the controller then uncordons and clears) or failed.
DRIVER_UPGRADE_REQUIRED = "upgrade-required"
DRIVER_UPGRADE_DONE = "done"
DRIVER_UPGRADE_FAILED_STATES = ("failed", "rolled-back")
DRIVER_UPGRADE_IN_FLIGHT_STATES = tuple(s for s in DRIVER_UPGRADE_STATES
                                        if s != DRIVER_UPGRADE_DONE and s not in DRIVER_UPGRADE_FAILED_STATES)
ANNOTATION_DRIVER_UPGRADE_MESSAGE = PREFIX + "driver.upgrade.message"   # why a node is failed
# The version the operator's controller started the node's upgrade to: the
# node's driver-manager acts only when its payload is that version (a pod of
# the previous payload, not yet replaced by the DaemonSet's rollout, waits).
ANNOTATION_DRIVER_UPGRADE_TARGET = PREFIX + "driver.upgrade.target"
# "true": the controller started the node's upgrade in place (upgradePolicy.enableRollout
# false): never cordoned, never evicted; its driver-manager installs only while the GPUs
# are idle, else it says "pending: in use" in driver.upgrade.message.
ANNOTATION_DRIVER_UPGRADE_IN_PLACE = PREFIX + "driver.upgrade.in-place"
# How such a wait begins in driver.upgrade.message: a wait, not a failure (no Degraded)
PENDING_MESSAGE_PREFIX = "pending: "
# What the node's driver-manager's payload is and which kernel driver it installs (the
# payload's declaration: MetaX's payload 2.29.0.13 installs 2.12.13). The controller
# compares the node's gpu.driver.* labels with the declared version, never with the
# payload's own version (docs/operator.md "driver upgradePolicy").
ANNOTATION_DRIVER_PAYLOAD_VERSION = PREFIX + "driver.payload.version"
ANNOTATION_DRIVER_PAYLOAD_DRIVER = PREFIX + "driver.payload.driver-version"
# set_vfnum.yml node state (issue 16), the MIG manager's vocabulary: pending
# while the node is being changed, then success or failed (with the reason in
# the message annotation). Ours, not gpu-label's.
LABEL_VFNUM_STATE = PREFIX + "gpu.vfnum.state"
ANNOTATION_VFNUM_MESSAGE = PREFIX + "gpu.vfnum.message"
VFNUM_STATES = ("pending", "success", "failed")
# The GPU Operator's driver component (issue 25): driver-manager's failure
# on its node (the controller's Degraded condition names node and reason from
# it), and the ConfigMap of module parameters and per-node vfnums (manual 3.2.3).
ANNOTATION_DRIVER_MESSAGE = PREFIX + "driver.message"
DRIVER_CONFIGMAP = "driver-config"
# Node maintenance (issue 40, module_utils/maintenance, docs/maintenance.md): the one
# protocol of set_vfnum, driver_upgrade, driver-manager and the health ladder. The
# procedure that holds the node (one of MAINTENANCE_OWNERS), and whose cordon it is:
# "ours" (the holder cordoned it: resume lifts it) or "admin" (cordoned before the
# pause: never lifted). LABEL_AGENTS_PAUSED's value is the holder too ("true", the
# driver upgrade's value before the protocol, reads as driver-upgrade).
ANNOTATION_MAINTENANCE_OWNER = PREFIX + "maintenance.owner"
ANNOTATION_MAINTENANCE_CORDON = PREFIX + "maintenance.cordon"
MAINTENANCE_OWNER_DRIVER_UPGRADE = "driver-upgrade"
MAINTENANCE_OWNER_SET_VFNUM = "set-vfnum"
MAINTENANCE_OWNER_DRIVER_MANAGER = "driver-manager"
MAINTENANCE_OWNER_HEALTH = "health"
# metax.gpu.gpu_device_mode switching a node between the device plugin and DRA (issue 41)
MAINTENANCE_OWNER_DEVICE_MODE = "device-mode"
MAINTENANCE_OWNERS = (MAINTENANCE_OWNER_DRIVER_UPGRADE, MAINTENANCE_OWNER_SET_VFNUM,
                      MAINTENANCE_OWNER_DRIVER_MANAGER, MAINTENANCE_OWNER_HEALTH, MAINTENANCE_OWNER_DEVICE_MODE)
MAINTENANCE_CORDON_OURS = "ours"
MAINTENANCE_CORDON_ADMIN = "admin"
# Every key the protocol writes: the roles and playbooks spell none of them (they call
# metax.gpu.node_maintenance; tests/unit/maintenance/test_maintenance_yaml.py keeps it so).
MAINTENANCE_KEYS = (LABEL_AGENTS_PAUSED, ANNOTATION_MAINTENANCE_OWNER, ANNOTATION_MAINTENANCE_CORDON,
                    ANNOTATION_PRE_CORDONED, LABEL_DRIVER_UPGRADE_STATE, ANNOTATION_DRIVER_UPGRADE_MESSAGE,
                    LABEL_VFNUM_STATE, ANNOTATION_VFNUM_MESSAGE, ANNOTATION_HEALTH_REMEDIATION)
# the driver upgrade strips metax-tech.com/ labels except these
DAY_TWO_LABELS = (LABEL_DRIVER_UPGRADE_STATE, LABEL_DRIVER_UPGRADE_SKIP, LABEL_AGENTS_PAUSED, LABEL_VFNUM_STATE)
# vfio-manager's node annotations (issue 43): whether the node has IOMMU ("enabled" /
# "disabled": the operator's controller names the nodes without it in the CR's
# condition), and why its last round failed (removed when a round succeeds)
ANNOTATION_VFIO_IOMMU = PREFIX + "vfio.iommu"
ANNOTATION_VFIO_MESSAGE = PREFIX + "vfio.message"

# The Node keys each node agent writes (issue 30), by agent (= its service
# account) and metadata field. The charts' ValidatingAdmissionPolicy lets an
# agent change only these, and only on its own node: its allowed sets are
# generated from this table (scripts/gen_node_agent_policy.py), and a unit test
# fails when the charts and this table disagree. Both charts (GPU Extensions,
# GPU Operator) use it. An agent that starts writing a new key needs it here
# first; a new node agent (a later operator component whose pods write Node
# keys) adds its row. The operator's readiness labels (maca.ready, runtime.ready)
# are in no row: the operator-controller sets them (component contract), so
# the policy refuses them to every agent (docs/security.md).
NODE_AGENT_KEYS: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "gpu-device": {"labels": (), "annotations": ANNOTATION_KEYS,
                   # status.conditions of this type, spec.taints of this key (issue 42)
                   "conditions": (CONDITION_GPU_HEALTHY,), "taints": (TAINT_GPU_HEALTH,)},
    "gpu-label": {"labels": GPU_LABEL_KEYS, "annotations": ()},
    # driver-manager (GPU Operator driver component): whose driver it is, the
    # vfnum state of driver-config's entry (set_vfnum.yml's vocabulary), and
    # its node's part of the rolling upgrade (driver_upgrade.yml's state label
    # and failure message; the controller sets upgrade-required and the target).
    # gpu.driver.mode is shared with gpu-label (SHARED_NODE_KEYS).
    # The remediation ladder (issue 42) adds: the cordon (spec.unschedulable, admitted only
    # with the maintenance protocol's record "ours" beside it), that record, its state,
    # the reboot request and its condition.
    "driver-manager": {"labels": (LABEL_DRIVER_MODE, LABEL_VFNUM_STATE, LABEL_DRIVER_UPGRADE_STATE),
                       "annotations": (ANNOTATION_DRIVER_MESSAGE, ANNOTATION_VFNUM_MESSAGE,
                                       ANNOTATION_DRIVER_UPGRADE_MESSAGE, ANNOTATION_DRIVER_PAYLOAD_VERSION,
                                       ANNOTATION_DRIVER_PAYLOAD_DRIVER, ANNOTATION_MAINTENANCE_OWNER,
                                       ANNOTATION_MAINTENANCE_CORDON, ANNOTATION_HEALTH_REMEDIATION,
                                       ANNOTATION_REBOOT_REQUIRED),
                       "conditions": (CONDITION_GPU_REMEDIATION,), "spec": ("unschedulable",)},
    # gpu-dra reads its Node (the device-mode label) and writes no key of it
    "gpu-dra": {"labels": (), "annotations": ()},
    # vfio-manager (GPU Operator vfioManager, issue 43): whether its node has IOMMU, and why
    # its last round failed
    "vfio-manager": {"labels": (), "annotations": (ANNOTATION_VFIO_IOMMU, ANNOTATION_VFIO_MESSAGE)},
}

# Keys two node agents may write, each with its one writer at run time: the
# policy allows both service accounts, the deployment picks one. With the
# driver component deployed the controller renders gpu-label with
# --driver-labels=false, so driver-manager alone writes gpu.driver.mode (and the
# controller alone driver.ready); in the GPU Extensions scheme gpu-label writes
# it (Table 2.7). docs/design-decisions.md.
SHARED_NODE_KEYS: Tuple[str, ...] = (LABEL_DRIVER_MODE,)

# The GPU Operator scheme (issue 24). The API group, kind, object and
# namespace are those of MetaX's own operator 0.9.2 (samples/kubernetes), so
# an administrator's `kubectl patch clusteroperator cluster-operator -n
# metax-operator ...` keeps working (the ClusterOperator is cluster-scoped, as
# the real one: kubectl ignores the -n; OPERATOR_NAMESPACE is the components').
OPERATOR_GROUP = "gpu." + DOMAIN
OPERATOR_VERSION = "v1alpha1"
OPERATOR_KIND = "ClusterOperator"
OPERATOR_PLURAL = "clusteroperators"
OPERATOR_CR_NAME = "cluster-operator"
OPERATOR_NAMESPACE = "metax-operator"
# The real product's finalizer name (the API server warns that it is not
# domain-qualified; kept for compatibility with CRs created by 0.9.2).
OPERATOR_FINALIZER = OPERATOR_GROUP
# Readiness labels chaining the components (real operator 0.9.2).
LABEL_MACA_READY = LABEL_PREFIX + "maca.ready"
LABEL_RUNTIME_READY = LABEL_PREFIX + "runtime.ready"
# Label the controller puts on every object it applies: the UID of the owning
# ClusterOperator (cluster-scoped objects cannot carry an ownerReference to a
# namespaced owner, so cleanup finds them by this label).
LABEL_OPERATOR_OWNER = OPERATOR_GROUP + "/owner"
OPERATOR_FIELD_MANAGER = "metax-operator-controller"
# The owner id a ClusterOperator carried over from a namespaced CRD keeps (the
# migration, docs/operator.md): LABEL_OPERATOR_OWNER's value, in the pod templates
# too, stays the old CR's uid, so no component pod is recreated by the move.
ANNOTATION_OPERATOR_OWNER_ID = OPERATOR_GROUP + "/owner-id"
# An object the controller creates once for the administrator to edit (driver-config,
# gpu-aware-plugin): never applied again nor put back; the digest of what it was created from.
ANNOTATION_OPERATOR_APPLY = OPERATOR_GROUP + "/apply"
ANNOTATION_OPERATOR_CREATED_FROM = OPERATOR_GROUP + "/created-from"
# The Lease of the operator-controller's leader election (in its namespace).
OPERATOR_LEADER_LEASE = "metax-operator-controller"
# The Events of the cluster-scoped ClusterOperator: where Kubernetes puts those of
# cluster-scoped objects (a Node's too), so that `kubectl describe` finds them.
OPERATOR_EVENT_NAMESPACE = "default"

# CDI (Container Device Interface, issue 26): the kind of the spec the node
# side writes and that runtimes, gpu-device and metax-docker name devices by
# (``metax-tech.com/gpu=0``, ``=GPU-<uuid>``, ``=<serial>``, ``=all``).
CDI_KIND = RESOURCE_NAME
CDI_ALL = "all"
# /var/run/cdi: the directory for specs generated from the live hardware
# (runtimes read it next to /etc/cdi, whose specs are static).
CDI_SPEC_DIR = "/var/run/cdi"
CDI_SPEC_FILE = "metax-tech.com-gpu.json"
# Where containers find the host's MXMACA, as in the vendor's images (§4).
MACA_CONTAINER_PATH = "/opt/maca"
# The charts of the two schemes (files/charts/), as their helm releases name them.
EXTENSIONS_CHART = "metax-gpu-extensions"
OPERATOR_CHART = "metax-operator"
# The node agents' workloads: their DaemonSets, and the pods' app.kubernetes.io/name,
# as MetaX's operator 0.9.2 names them (samples/kubernetes/operator-0.9.2-daemonsets.txt),
# so `kubectl rollout restart ds/metax-gpu-device` and the manual's metax-gpu-device-*
# pods work on ours. Both schemes share them (one chart). The images and service
# accounts keep the agents' own names (gpu-device, ...), as metax-driver runs
# driver-manager (docs/design-decisions.md). The Component of each
# (clusteroperator/components.py) carries the same name; the chart writes it.
DAEMONSET_GPU_LABEL = "metax-gpu-label"
DAEMONSET_GPU_DEVICE = "metax-gpu-device"
DAEMONSET_CONTAINER_RUNTIME = "metax-container-runtime"
DAEMONSET_GPU_EXPORTER = "metax-gpu-exporter"
DAEMONSET_DRIVER = "metax-driver"
DAEMONSET_MACA = "metax-maca"
# The pods of the two agents that read the GPUs directly (set_vfnum and the
# driver upgrade wait for them to leave a node); the names before issue 38 too,
# for a cluster whose chart is not upgraded yet.
NODE_AGENT_POD_SELECTOR = "app.kubernetes.io/name in (%s, %s, gpu-device, gpu-label)" % (
    DAEMONSET_GPU_DEVICE, DAEMONSET_GPU_LABEL)
# Device-plugin DaemonSets: ours (and MetaX operator 0.9.2's), and ours before issue 38.
DEVICE_PLUGIN_DAEMONSETS = (DAEMONSET_GPU_DEVICE, "gpu-device")
# The RuntimeClass of real MetaX clusters (workloads name runtimeClassName: metax),
# and the containerd runtime handler container-runtime adds for it beside the
# others, never as the default: a copy of the default runtime (docs/runtime.md).
RUNTIME_CLASS = "metax"
RUNTIME_HANDLER = "metax"
# driver-manager's service account (metax-driver.yaml) and the eviction guard, the admission
# webhook that confines its evictions to its own node (eviction_webhook.py, docs/security.md):
# its Service, TLS Secret and ValidatingWebhookConfiguration name, and its Deployment in the
# Extensions chart (the operator-controller serves it in the GPU Operator scheme).
SERVICE_ACCOUNT_DRIVER_MANAGER = "driver-manager"
SERVICE_ACCOUNT_VFIO_MANAGER = "vfio-manager"
EVICTION_WEBHOOK = "metax-eviction-guard"
# Dynamic Resource Allocation (issue 41, docs/dra.md). The driver name gpu-dra
# registers with the kubelet and writes in its ResourceSlices (its attributes
# are gpu.metax-tech.com/<name>); the DeviceClasses of a whole GPU and of a VF;
# the device taint of an unhealthy device; the per-node switch between the
# device plugin and DRA (absent: the device plugin). The two DaemonSets select
# the nodes by it, so a node is never served by both.
DRA_DRIVER = "gpu." + DOMAIN
DRA_DEVICE_CLASS_GPU = "gpu.metax-tech.com"
DRA_DEVICE_CLASS_VF = "vf.gpu.metax-tech.com"
DRA_TAINT_UNHEALTHY = DRA_DRIVER + "/unhealthy"
LABEL_DEVICE_MODE = PREFIX + "gpu.device-mode"
DEVICE_MODE_PLUGIN = "device-plugin"
DEVICE_MODE_DRA = "dra"
DAEMONSET_GPU_DRA = "metax-gpu-dra"
# The pods that serve metax-tech.com/gpu, in either mode: a mode switch holds the node
# until both are gone (metax.gpu.gpu_device_mode, dra/switch.py).
DEVICE_MODE_AGENT_POD_SELECTOR = "app.kubernetes.io/name in (%s, %s, gpu-device)" % (
    DAEMONSET_GPU_DEVICE, DAEMONSET_GPU_DRA)
# the CDI spec gpu-dra writes per prepared claim: <prefix><claim uid>.json
CDI_CLAIM_SPEC_PREFIX = "metax-tech.com-gpu-claim-"
# The node agents that write ResourceSlices, each with the one DRA driver its
# slices may name: the node-agent admission policy lets such an agent create,
# update and delete only slices of that driver whose spec.nodeName is its own
# pod's node (generated into the policy chart like NODE_AGENT_KEYS).
NODE_AGENT_RESOURCE_SLICES: Dict[str, str] = {"gpu-dra": DRA_DRIVER}

# GPUs for virtual machines (issue 43), as MetaX's operator 0.9.2 has them: the
# resource vfio-manager advertises per IOMMU group (a GPU bound to vfio-pci), its
# DaemonSet, and driver-config's key listing which GPUs of which node go to VMs
# (a YAML list of {nodeName, gpus: "<mx-smi indices>|all"}).
VFIO_RESOURCE_NAME = PREFIX + "vfio-gpu"
DAEMONSET_VFIO_MANAGER = "metax-vfio-manager"
DRIVER_CONFIG_VFIO_KEY = "vfio"
