"""The health policy table and its evaluator: thresholds, rates, hold-off, recovery, no informational quarantine."""
from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.health import policy as P
from ansible_collections.metax.gpu.plugins.module_utils.health.evaluate import (
    ESCALATED, FAILING, RECOVERED, Evaluator, fires)
from ansible_collections.metax.gpu.plugins.module_utils.health.signals import SIGNAL_NAMES, GpuReading, NodeReading

A, B = "0000:0a:00.0", "0000:0b:00.0"


def reading(at, **values_by_gpu):
    """reading(10, a={"ecc-dram-uncorrectable": 1}) -> a NodeReading at t=10 (a -> GPU A, b -> GPU B)."""
    gpus = []
    for key, values in sorted(values_by_gpu.items()):
        bdf, index = (A, 0) if key == "a" else (B, 1)
        gpus.append(GpuReading(bdf, index, "", values))
    return NodeReading(at, tuple(gpus))


# -- the table ---------------------------------------------------------------------
def test_every_signal_has_a_default_row_and_nothing_quarantines_by_default():
    assert {r.signal for r in P.DEFAULT_RULES} == set(SIGNAL_NAMES)
    for rule in P.DEFAULT_RULES:
        P.validate_rule(rule)
    assert not [r for r in P.DEFAULT_RULES if r.action == P.QUARANTINE]
    # the four old checks keep their effect: Allocatable drops (mx-smi silence never made GPUs unhealthy)
    assert {r.signal for r in P.DEFAULT_RULES if r.action == P.DEVICE_UNHEALTHY} >= {
        "gpu-lost", "driver-not-loaded", "driver-unbound", "gpu-not-available", "ecc-dram-uncorrectable"}
    assert P.DEFAULT_POLICY.rules_of("mx-smi-unresponsive")[0].action == P.NODE_CONDITION


def test_the_document_round_trips_and_a_cluster_changes_one_signal():
    assert P.parse_policy(P.policy_document()) == P.DEFAULT_POLICY
    assert P.parse_policy(None) is P.DEFAULT_POLICY and P.parse_policy({}) is P.DEFAULT_POLICY
    mine = P.parse_policy({"holdOffSeconds": 60, "recoveryReadings": 5,
                           "eid": {"pattern": r"code=(?P<eid>\d+)", "logFiles": ["/var/log/syslog"]},
                           "rules": [{"signal": "ecc-dram-uncorrectable", "threshold": 1, "severity": "critical",
                                      "action": "quarantine", "effect": "NoExecute"}]})
    assert mine.hold_off_seconds == 60 and mine.recovery_readings == 5 and mine.log_files == ("var/log/syslog",)
    assert mine.rules_of("ecc-dram-uncorrectable") == (
        P.Rule("ecc-dram-uncorrectable", "critical", "quarantine", threshold=1, effect="NoExecute"),)
    # the two default rows of dram-correctable are untouched
    assert len(mine.rules_of("ecc-dram-correctable")) == 2


@pytest.mark.parametrize("rule, message", [
    ({"signal": "pci-aer-ce", "rate": 1, "severity": "info", "action": "quarantine", "effect": "NoSchedule"},
     "informational row never quarantines"),
    ({"signal": "ecc-dram-correctable", "threshold": 1, "severity": "critical", "action": "quarantine",
      "effect": "NoSchedule"}, "corrected errors are informational"),
    ({"signal": "ecc-dram-uncorrectable", "threshold": 1, "severity": "critical", "action": "quarantine"},
     "needs effect NoSchedule or NoExecute"),
    ({"signal": "ecc-dram-uncorrectable", "threshold": 1, "severity": "critical", "action": "observe",
      "effect": "NoSchedule"}, "effect is for action quarantine only"),
    ({"signal": "xid-79", "threshold": 1, "severity": "critical", "action": "observe"}, "unknown signal"),
    ({"signal": "pci-aer-ue", "threshold": 1, "rate": 2, "severity": "critical", "action": "observe"},
     "exactly one of threshold and rate"),
    ({"signal": "pci-aer-ue", "threshold": 0, "severity": "critical", "action": "observe"}, "1 or more"),
    ({"signal": "pci-aer-ue", "threshold": "1", "severity": "critical", "action": "observe"}, "whole number"),
    ({"signal": "pci-aer-ue", "threshold": 1, "severity": "fatal", "action": "observe"}, "severity 'fatal'"),
    ({"signal": "pci-aer-ue", "threshold": 1, "severity": "critical", "action": "reboot"}, "action 'reboot'"),
    ({"signal": "pci-aer-ue", "threshold": 1, "severity": "critical", "action": "observe", "colour": 1},
     "unknown key"),
    ({"signal": "pci-aer-ue", "threshold": 1, "severity": "critical", "action": "observe", "remediate": "yes"},
     "remediate is true or false"),
])
def test_bad_rows_are_refused_with_the_reason(rule, message):
    with pytest.raises(P.PolicyError, match=message):
        P.parse_policy({"rules": [rule]})


@pytest.mark.parametrize("doc, message", [
    ({"holdOffSeconds": -1}, "holdOffSeconds"), ({"recoveryReadings": 0}, "recoveryReadings"),
    ({"eid": {"pattern": "EID (\\d+)"}}, "no named group"), ({"eid": {"logFiles": "kern.log"}}, "list of paths"),
    ({"rules": {"signal": "x"}}, "rules must be a list"), ({"colour": 1}, "unknown key"), ("nope", "mapping"),
])
def test_bad_documents_are_refused(doc, message):
    with pytest.raises(P.PolicyError, match=message):
        P.parse_policy(doc)


# -- firing -------------------------------------------------------------------------
def test_threshold_and_rate_rows():
    threshold = P.Rule("ecc-dram-uncorrectable", "critical", "device-unhealthy", threshold=2)
    assert not fires(threshold, 1, [], 0) and fires(threshold, 2, [], 0)
    rate = P.Rule("pci-aer-ce", "warning", "node-condition", rate=10, window_seconds=60)
    assert not fires(rate, 500, [], 100)                       # no baseline yet: growth unknown
    assert fires(rate, 510, [(50, 500)], 100)
    assert not fires(rate, 510, [(30, 500)], 100)              # the baseline left the window
    assert not fires(rate, 509, [(50, 500), (90, 505)], 100)


# -- the evaluator ---------------------------------------------------------------------
def evaluator(**policy_changes):
    return Evaluator(P.Policy(P.DEFAULT_RULES, **policy_changes))


def test_an_uncorrectable_ecc_fails_one_gpu_and_recovers_after_m_clean_readings_and_the_hold_off():
    ev = evaluator(hold_off_seconds=30, recovery_readings=3)
    clean = {"ecc-dram-uncorrectable": 0, "gpu-not-available": 0}
    assert ev.evaluate(reading(0, a=clean, b=clean)).transitions == ()
    bad = ev.evaluate(reading(5, a={"ecc-dram-uncorrectable": 1}, b=clean))
    assert [(t.kind, t.bdf, t.signal) for t in bad.transitions] == [(FAILING, A, "ecc-dram-uncorrectable")]
    assert bad.unhealthy_gpus == {A} and bad.condition_failing and bad.quarantine is None
    # the driver reload resets the counter: clean readings from t=10
    for t in (10, 15, 20):
        d = ev.evaluate(reading(t, a=clean, b=clean))
        assert d.transitions == () and d.unhealthy_gpus == {A}      # 3 clean readings, but held 30 s
    d = ev.evaluate(reading(35, a=clean, b=clean))
    assert [(t.kind, t.out_of_service) for t in d.transitions] == [(RECOVERED, 30)]
    assert d.unhealthy_gpus == frozenset() and not d.condition_failing and d.findings == ()


def test_a_flapping_gpu_makes_one_transition_within_the_hold_off():
    ev = evaluator(hold_off_seconds=60, recovery_readings=2)
    kinds = []
    for t, state in enumerate([0, 1, 0, 1, 0, 1, 0, 0]):
        kinds += [x.kind for x in ev.evaluate(reading(t * 5, a={"pci-aer-ue": state})).transitions]
    assert kinds == [FAILING]
    # held until 60 s after the last bad reading (t=25) and 2 clean readings
    assert ev.evaluate(reading(80, a={"pci-aer-ue": 0})).transitions == ()
    assert [t.kind for t in ev.evaluate(reading(85, a={"pci-aer-ue": 0})).transitions] == [RECOVERED]


def test_the_four_old_checks_recover_at_the_first_clean_reading_as_before_unless_a_row_says_otherwise():
    ev = evaluator(hold_off_seconds=300, recovery_readings=3)
    ev.evaluate(reading(0, a={"gpu-not-available": 1, "gpu-lost": 0}))
    assert [t.kind for t in ev.evaluate(reading(5, a={"gpu-not-available": 0})).transitions] == [RECOVERED]
    mine = P.parse_policy({"holdOffSeconds": 300, "rules": [
        {"signal": "gpu-not-available", "threshold": 1, "severity": "critical", "action": "device-unhealthy"},
        {"signal": "gpu-lost", "threshold": 1, "severity": "critical", "action": "device-unhealthy",
         "holdOffSeconds": 10, "recoveryReadings": 2}]})
    ev = Evaluator(mine)
    ev.evaluate(reading(0, a={"gpu-not-available": 1, "gpu-lost": 1}))
    d = ev.evaluate(reading(5, a={"gpu-not-available": 0, "gpu-lost": 0}))
    d = ev.evaluate(reading(15, a={"gpu-not-available": 0, "gpu-lost": 0}))
    assert [(t.kind, t.signal) for t in d.transitions] == [(RECOVERED, "gpu-lost")]       # its own 10 s, 2 readings
    assert [f.signal for f in d.findings] == ["gpu-not-available"]                        # the policy's 300 s


def test_informational_events_never_quarantine_and_observe_rows_only_observe():
    policy = P.with_rules(P.DEFAULT_POLICY, P.Rule("pci-aer-ue", "critical", "quarantine", threshold=1,
                                                   effect="NoSchedule"))
    ev = Evaluator(policy)
    ev.evaluate(reading(0, a={"pci-aer-ce": 0, "eid-sdk": 0, "ecc-sram-correctable": 0}))
    d = ev.evaluate(reading(5, a={"pci-aer-ce": 40, "eid-sdk": 3, "ecc-sram-correctable": 7}))
    assert {t.signal for t in d.transitions} == {"pci-aer-ce", "eid-sdk", "ecc-sram-correctable"}
    assert all(f.rule.action == P.OBSERVE and f.rule.severity == P.INFO for f in d.findings)
    assert d.quarantine is None and d.unhealthy_gpus == frozenset() and not d.condition_failing
    d = ev.evaluate(reading(10, a={"pci-aer-ue": 1}))
    assert d.quarantine == "NoSchedule" and d.unhealthy_gpus == {A}


def test_a_stronger_row_escalates_and_no_execute_wins():
    policy = P.with_rules(P.DEFAULT_POLICY,
                          P.Rule("ecc-dram-correctable", "info", "observe", rate=1),
                          P.Rule("ecc-dram-correctable", "warning", "quarantine", rate=100, effect="NoExecute"))
    policy = P.with_rules(policy, P.Rule("pci-aer-ue", "critical", "quarantine", threshold=1, effect="NoSchedule"))
    ev = Evaluator(policy)
    ev.evaluate(reading(0, a={"ecc-dram-correctable": 0}, b={"pci-aer-ue": 1}))
    d = ev.evaluate(reading(5, a={"ecc-dram-correctable": 2}, b={"pci-aer-ue": 1}))
    assert [(t.kind, t.rule.action) for t in d.transitions] == [(FAILING, "observe")]
    assert d.quarantine == "NoSchedule"
    d = ev.evaluate(reading(10, a={"ecc-dram-correctable": 300}, b={"pci-aer-ue": 1}))
    assert [(t.kind, t.rule.action) for t in d.transitions] == [(ESCALATED, "quarantine")]
    assert d.quarantine == "NoExecute"
    # back under the rate: held at the stronger row, not stepped down
    d = ev.evaluate(reading(15, a={"ecc-dram-correctable": 300}, b={"pci-aer-ue": 1}))
    assert d.transitions == () and d.quarantine == "NoExecute"


def test_unknown_signals_are_no_news_and_a_reset_counter_starts_again():
    ev = evaluator(hold_off_seconds=0, recovery_readings=1)
    ev.evaluate(reading(0, a={"pci-aer-ue": 2}))
    assert ev.evaluate(reading(5, a={})).findings[0].signal == "pci-aer-ue"      # -j did not answer: held
    d = ev.evaluate(reading(10, a={"pci-aer-ue": 0}))
    assert [t.kind for t in d.transitions] == [RECOVERED]
    # an EID counts while recent: rate 1 in 600 s
    ev.evaluate(reading(20, a={"eid-driver": 0}))
    d = ev.evaluate(reading(25, a={"eid-driver": 1}))
    assert [t.kind for t in d.transitions] == [FAILING] and d.condition_failing
    assert ev.evaluate(reading(300, a={"eid-driver": 1})).transitions == ()          # still within 600 s
    assert ev.evaluate(reading(630, a={"eid-driver": 1})).transitions[0].kind == RECOVERED


def test_a_remediating_row_names_the_first_ladder_step():
    policy = P.with_rules(P.DEFAULT_POLICY, P.Rule("pci-mmio", "critical", "quarantine", threshold=1,
                                                   effect="NoSchedule", remediate=True))
    d = Evaluator(policy).evaluate(reading(0, b={"pci-mmio": 1}))
    assert [(r.bdf, r.signal, r.step) for r in d.ladder] == [(B, "pci-mmio", "cordon")]
    assert P.LADDER_STEPS == ("cordon", "evict", "driver-reload", "reboot-request")


def test_a_policy_change_applies_to_held_signals():
    ev = evaluator()
    ev.evaluate(reading(0, a={"pci-aer-ue": 1}))
    ev.set_policy(P.with_rules(P.DEFAULT_POLICY, P.Rule("pci-aer-ue", "critical", "quarantine", threshold=1,
                                                        effect="NoExecute")))
    d = ev.evaluate(reading(5, a={"pci-aer-ue": 1}))
    assert d.quarantine == "NoExecute" and d.findings[0].since == 0
