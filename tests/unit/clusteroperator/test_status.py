# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Status of the ClusterOperator: conditions naming nodes, no write when nothing changed."""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.mapping import IGNORED_VALUES_ANNOTATION
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.status import (
    component_status, ignored_condition, ignored_fields, node_messages, overall, readiness_labels, same_status,
    waiting_nodes, with_transition_times)

from .test_contract import FULL, MACA


def ds(desired, ready, updated=None, generation=1, observed=1):
    return {"metadata": {"generation": generation},
            "status": {"desiredNumberScheduled": desired, "numberReady": ready, "observedGeneration": observed,
                       "updatedNumberScheduled": desired if updated is None else updated}}


def pod(node, ready, waiting=None):
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": "p-" + node}, "spec": {"nodeName": node}, "status": status}


def node(name, **labels):
    return {"metadata": {"name": name, "labels": {names.PREFIX + k: v for k, v in labels.items()}}}


def cond(entry, kind):
    return next(c for c in entry["conditions"] if c["type"] == kind)


def test_ready_when_every_pod_is_ready_and_updated():
    entry = component_status(components.GPU_DEVICE, {}, ds(2, 2), [pod("vm", True), pod("vm-2", True)], {})
    assert cond(entry, "Ready")["status"] == "True" and entry["ready"] == 2
    assert cond(entry, "Degraded")["status"] == "False"


def test_rolling_out_and_degraded_name_the_nodes():
    pods = [pod("vm", True), pod("vm-2", False, "ImagePullBackOff")]
    entry = component_status(components.GPU_DEVICE, {}, ds(2, 1, updated=1, generation=2, observed=2), pods, {})
    assert cond(entry, "Ready")["status"] == "False"
    assert "vm-2" in cond(entry, "Ready")["message"] and "vm," not in cond(entry, "Ready")["message"]
    assert cond(entry, "Degraded") == {"type": "Degraded", "status": "True", "reason": "ImagePullBackOff",
                                       "message": "pods failing on vm-2"}
    top = overall([entry, component_status(components.GPU_LABEL, {}, ds(3, 3), [], {})])
    assert top[0]["status"] == "False" and top[0]["message"].startswith("metax-gpu-device: ")
    assert top[2]["status"] == "True"


def test_not_deployed_and_missing_workload():
    off = component_status(components.GPU_AWARE, {}, None, [], {})
    assert cond(off, "Ready")["reason"] == "NotDeployed" and off["deployed"] is False
    minimal = component_status(components.GPU_AWARE, {"gpuAware": {"deploy": True}, "minimal": True}, None, [], {})
    assert cond(minimal, "Ready")["reason"] == "MinimalMode"
    creating = component_status(components.GPU_DEVICE, {}, None, [], {})
    assert cond(creating, "Ready")["reason"] == "Creating"
    top = overall([off, component_status(components.GPU_LABEL, {}, ds(1, 1), [], {})])
    assert top[0] == {"type": "Ready", "status": "True", "reason": "AllComponentsReady", "message": "metax-gpu-label ready"}


def test_waiting_nodes_name_the_missing_readiness_label():
    nodes = [node("vm", **{"gpu.installed": "true", "runtime.ready": "true"}),
             node("vm-2", **{"gpu.installed": "true", "runtime.ready": "true", "maca.ready": "true"}),
             node("cpu")]
    assert waiting_nodes(components.GPU_DEVICE, FULL, {"maca": {"deploy": True}}, nodes) == {
        "vm": [names.LABEL_MACA_READY]}
    # the MACA component on (its default, as the real product's): vm waits for it
    assert waiting_nodes(components.GPU_DEVICE, components.REGISTRY, {}, nodes) == {"vm": [names.LABEL_MACA_READY]}
    # switched off: nothing sets maca.ready, so nothing waits for it
    assert waiting_nodes(components.GPU_DEVICE, components.REGISTRY, {"maca": {"deploy": False}}, nodes) == {}
    entry = component_status(components.GPU_DEVICE, {}, ds(1, 1), [pod("vm-2", True)],
                             {"vm": [names.LABEL_MACA_READY]})
    # ready where it runs, not on vm, which it targets: not Ready, naming the node and the label
    assert cond(entry, "Ready") == {"type": "Ready", "status": "False", "reason": "WaitingForChain",
                                    "message": "1/1 pods ready; waiting for metax-tech.com/maca.ready on vm"}
    assert cond(entry, "Degraded")["status"] == "False"


def test_transition_times_and_idle_writes():
    first = with_transition_times([{"type": "Ready", "status": "True"}], None, "t1")
    again = with_transition_times([{"type": "Ready", "status": "True"}], first, "t2")
    flipped = with_transition_times([{"type": "Ready", "status": "False"}], again, "t3")
    assert first[0]["lastTransitionTime"] == again[0]["lastTransitionTime"] == "t1"
    assert flipped[0]["lastTransitionTime"] == "t3"
    assert same_status({"conditions": first}, {"conditions": again})
    assert not same_status({"conditions": first}, {"conditions": flipped})
    assert not same_status(None, {"conditions": first})


def test_readiness_label_follows_the_pod():
    nodes = [node("vm", **{"maca.ready": "true"}), node("vm-2"), node("vm-3", **{"maca.ready": "true"})]
    pods = [pod("vm", True), pod("vm-2", True), pod("vm-3", False)]
    assert readiness_labels(MACA, pods, nodes) == {"vm-2": {names.LABEL_MACA_READY: "true"},
                                                   "vm-3": {names.LABEL_MACA_READY: None}}
    assert readiness_labels(components.GPU_DEVICE, pods, nodes) == {}


def test_driver_manager_reports_on_a_node_make_the_driver_component_degraded_naming_it():
    message = {names.ANNOTATION_VFNUM_MESSAGE: "vfnum 3 is not one of 0, 1, 2, 4, 8"}
    nodes = [{"metadata": {"name": "vm-3", "annotations": message}},
             {"metadata": {"name": "vm", "annotations": {"other": "x"}}}]
    problems = node_messages(components.DRIVER, nodes)
    assert problems == {"vm-3": "vfnum 3 is not one of 0, 1, 2, 4, 8"}
    spec = {"driver": {"deploy": True}}
    entry = component_status(components.DRIVER, spec, ds(3, 3), [pod(n, True) for n in ("vm", "vm-2", "vm-3")], {},
                             dict(problems, ghost="node-vfnums names a node that does not exist"))
    degraded = cond(entry, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NodeReported"
    assert degraded["message"] == ("ghost: node-vfnums names a node that does not exist; "
                                   "vm-3: vfnum 3 is not one of 0, 1, 2, 4, 8")
    assert cond(entry, "Ready")["status"] == "True"       # the driver itself is fine
    assert node_messages(components.GPU_DEVICE, nodes) == {}


def test_the_cr_is_not_ready_while_any_component_is_not_ready_on_a_node_it_targets_and_names_them_all():
    driver = component_status(components.DRIVER, {}, ds(3, 2), [pod("vm", True), pod("vm-2", True),
                                                                pod("vm-3", False)], {})
    device = component_status(components.GPU_DEVICE, {}, ds(2, 2), [pod("vm", True), pod("vm-2", True)],
                              {"vm-3": [names.LABEL_DRIVER_READY, names.LABEL_MACA_READY]})
    label = component_status(components.GPU_LABEL, {}, ds(3, 3), [], {})
    top = overall([label, driver, device])
    assert top[0]["status"] == "False" and top[0]["reason"] == "RollingOut"
    assert top[0]["message"] == ("%s: 2/3 pods ready, not ready on vm-3; %s: 2/2 pods ready; "
                                 "waiting for metax-tech.com/driver.ready, metax-tech.com/maca.ready on vm-3"
                                 % (components.DRIVER.name, components.GPU_DEVICE.name))
    # every pod ready and nothing waiting: Ready, naming the deployed components
    ready = overall([label, component_status(components.GPU_DEVICE, {}, ds(3, 3), [], {})])
    assert ready[0] == {"type": "Ready", "status": "True", "reason": "AllComponentsReady",
                        "message": "%s, %s ready" % (components.GPU_LABEL.name, components.GPU_DEVICE.name)}
    assert [c["type"] for c in ready] == ["Ready", "Progressing", "Degraded"]     # nothing ignored: no 4th


def test_ignored_fields_name_what_the_cr_and_the_values_carry_and_we_do_not_act_on():
    cr = {"metadata": {"annotations": {IGNORED_VALUES_ANNOTATION: "serviceAccount, controller.image,, cmInit"}},
          "spec": {"driver": {"fwEffectPolicy": "NextReboot", "fwEnableVirt": False, "fwUpgradePolicy": "Never",
                              "deployPolicy": "PreferCloud"},
                   "vfioManager": {"deploy": True}}}
    assert ignored_fields(cr) == [
        "spec.driver.fwEffectPolicy", "spec.driver.fwEnableVirt", "spec.driver.fwUpgradePolicy",
        "values cmInit", "values controller.image", "values serviceAccount"]
    # vfioManager is acted on since issue 43 (vfio-manager): neither value is reported
    assert ignored_fields({"spec": {"vfioManager": {"deploy": False}, "driver": {}}}) == []
    assert ignored_fields({}) == [] and ignored_condition([]) is None
    extra = overall([component_status(components.GPU_LABEL, {}, ds(1, 1), [], {})], ignored_fields(cr))[-1]
    assert extra["type"] == "IgnoredFields" and extra["status"] == "True" and extra["reason"] == "AcceptedNotActedOn"
    assert extra["message"].endswith(": spec.driver.fwEffectPolicy, spec.driver.fwEnableVirt, "
                                     "spec.driver.fwUpgradePolicy, values cmInit, "
                                     "values controller.image, values serviceAccount")
    # one condition for all, with a stable transition time while the list stays
    first = with_transition_times([extra], None, "t1")
    assert with_transition_times([extra], first, "t2")[0]["lastTransitionTime"] == "t1"


def test_an_in_place_upgrade_waiting_for_idle_gpus_is_no_failure():
    waiting = {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: names.PENDING_MESSAGE_PREFIX + "in use (pod ml/train-0 "
               "requests metax-tech.com/gpu); the upgrade to 2.29.0.13 waits until the node's GPUs are idle"}
    failed = {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: "driver verification failed; rolled back to 2.14.6"}
    nodes = [{"metadata": {"name": "vm", "annotations": waiting}}, {"metadata": {"name": "vm-2", "annotations": failed}}]
    assert node_messages(components.DRIVER, nodes) == {"vm-2": "driver verification failed; rolled back to 2.14.6"}
