# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU health policy table: which signal, past which threshold or rate, does what. Pure.

The one definition of the table and its shipped defaults (docs/health.md
prints it). A cluster changes it through the ConfigMap of the Extensions
chart (``gpuDevice.healthPolicy``) or the ClusterOperator's
``spec.gpuDevice.healthPolicy``; both carry the same document, read by
:func:`parse_policy`::

    holdOffSeconds: 300          # a failing GPU stays failing at least this long after its last bad reading
    recoveryReadings: 3          # ... and until this many clean readings in a row
    eid:
      pattern: '...'             # a regex with (?P<eid>...), optionally (?P<bdf>...), (?P<sdk>...)
      logFiles: [var/log/kern.log, var/log/messages]
    rules:                       # replace the default rows of the signals they name
      - signal: ecc-dram-uncorrectable
        threshold: 1             # value >= threshold, or
        # rate: 10               # the value grew by >= rate within windowSeconds
        # windowSeconds: 3600
        severity: critical       # info | warning | critical
        action: device-unhealthy # observe | node-condition | device-unhealthy | quarantine
        # effect: NoSchedule     # quarantine only: NoSchedule | NoExecute
        # holdOffSeconds, recoveryReadings: this row's own (default: the policy's)

Actions are cumulative, weakest first: ``observe`` (a metric and an Event),
``node-condition`` (also the node's MetaXGPUHealthy condition turns False),
``device-unhealthy`` (also the GPU leaves Allocatable), ``quarantine`` (also
the node taint metax-tech.com/gpu-health with the row's effect).

Informational rows never quarantine: a row of severity ``info`` with action
``quarantine`` is refused, and so is a ``threshold`` row that would
quarantine on a correctable-error counter (one corrected error is no reason
to take a node out; a rate may be).

``remediate: true`` on a row turns the remediation ladder on for it (off by
default): while such a row fails, driver-manager on that node cordons, evicts
the GPU pods, reloads the driver and at last requests a reboot, one step at a
time, at most ``remediation.maxNodes`` nodes at once (health/ladder.py,
docs/health.md "Remediation")::

    remediation:
      maxNodes: 1                # nodes in remediation at once, cluster-wide
      evictTimeoutSeconds: 300   # the GPU pods' time to leave after their eviction
      settleSeconds: 600         # after the driver reload: the health's time to recover before the reboot request
      rebootSentinel: ""         # a file under the host root created with the reboot request ("" none)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import MetaxGpuError
from .eid import DEFAULT_LOG_FILES, DEFAULT_PATTERN, PatternError, compile_pattern
from .signals import SIGNALS

OBSERVE = "observe"
NODE_CONDITION = "node-condition"
DEVICE_UNHEALTHY = "device-unhealthy"
QUARANTINE = "quarantine"
ACTIONS: Tuple[str, ...] = (OBSERVE, NODE_CONDITION, DEVICE_UNHEALTHY, QUARANTINE)   # weakest first
INFO, WARNING, CRITICAL = "info", "warning", "critical"
SEVERITIES: Tuple[str, ...] = (INFO, WARNING, CRITICAL)
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"
EFFECTS: Tuple[str, ...] = (NO_SCHEDULE, NO_EXECUTE)
# counters of errors the hardware corrected: informational by nature
CORRECTABLE_SIGNALS = frozenset({"ecc-sram-correctable", "ecc-dram-correctable", "pci-aer-ce", "ras-corrected",
                                 "mxlk-aer-ce"})
# the remediation ladder's steps, in order (issue 42; driver-manager runs them through the
# node-maintenance protocol: health/ladder.py)
LADDER_STEPS: Tuple[str, ...] = ("cordon", "evict", "driver-reload", "reboot-request")
DEFAULT_MAX_REMEDIATING = 1
DEFAULT_EVICT_TIMEOUT = 300
DEFAULT_SETTLE = 600
DEFAULT_WINDOW = 3600
DEFAULT_HOLD_OFF = 300
DEFAULT_RECOVERY_READINGS = 3


class PolicyError(MetaxGpuError, ValueError):
    """A policy document that cannot be used; nothing of it is applied."""


@dataclass(frozen=True)
class Rule:
    signal: str
    severity: str
    action: str
    threshold: Optional[int] = None
    rate: Optional[int] = None
    window_seconds: int = DEFAULT_WINDOW
    effect: Optional[str] = None          # quarantine only
    remediate: bool = False               # the remediation ladder (health/ladder.py) while this row fails
    # this row's own hold-off and clean readings (None: the policy's)
    hold_off_seconds: Optional[int] = None
    recovery_readings: Optional[int] = None

    @property
    def strength(self) -> Tuple[int, int, int]:
        """Orders rows: the action, then the severity, then NoExecute over NoSchedule."""
        return ACTIONS.index(self.action), SEVERITIES.index(self.severity), 1 if self.effect == NO_EXECUTE else 0

    def describe(self) -> str:
        when = ">= %d" % self.threshold if self.threshold is not None else \
            "+%d in %ds" % (self.rate or 0, self.window_seconds)
        action = "%s(%s)" % (self.action, self.effect) if self.action == QUARANTINE else self.action
        return "%s %s: %s, %s" % (self.signal, when, self.severity, action)


@dataclass(frozen=True)
class Remediation:
    """The remediation ladder's settings (the policy's ``remediation``)."""

    max_nodes: int = DEFAULT_MAX_REMEDIATING           # nodes in remediation at once, cluster-wide
    evict_timeout_seconds: int = DEFAULT_EVICT_TIMEOUT
    settle_seconds: int = DEFAULT_SETTLE                # after the driver reload, before the reboot request
    reboot_sentinel: str = ""                           # host-root path created with the reboot request


@dataclass(frozen=True)
class Policy:
    rules: Tuple[Rule, ...]
    hold_off_seconds: int = DEFAULT_HOLD_OFF
    recovery_readings: int = DEFAULT_RECOVERY_READINGS
    eid_pattern: str = DEFAULT_PATTERN
    log_files: Tuple[str, ...] = DEFAULT_LOG_FILES
    remediation: Remediation = Remediation()

    def rules_of(self, signal: str) -> Tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.signal == signal)


def _r(signal: str, severity: str, action: str, threshold: Optional[int] = None, rate: Optional[int] = None,
       window: int = DEFAULT_WINDOW, hold_off: Optional[int] = None, readings: Optional[int] = None) -> Rule:
    return Rule(signal, severity, action, threshold=threshold, rate=rate, window_seconds=window,
                hold_off_seconds=hold_off, recovery_readings=readings)


# The shipped table. Nothing quarantines by default: a cluster opts in per row.
# What the device plugin always did stays, to the reading: a GPU off the bus,
# unbound, without its driver or reported not available leaves Allocatable and
# comes back at the first clean reading (no hold-off: those rows say so); an
# mx-smi that does not answer says nothing about the GPUs (it never made them
# unhealthy).
_AS_BEFORE = {"hold_off": 0, "readings": 1}
DEFAULT_RULES: Tuple[Rule, ...] = (
    _r("gpu-lost", CRITICAL, DEVICE_UNHEALTHY, threshold=1, **_AS_BEFORE),
    _r("driver-not-loaded", CRITICAL, DEVICE_UNHEALTHY, threshold=1, **_AS_BEFORE),
    _r("driver-unbound", CRITICAL, DEVICE_UNHEALTHY, threshold=1, **_AS_BEFORE),
    _r("mx-smi-unresponsive", WARNING, NODE_CONDITION, threshold=1, **_AS_BEFORE),
    _r("gpu-not-available", CRITICAL, DEVICE_UNHEALTHY, threshold=1, **_AS_BEFORE),
    # data was lost: the GPU must not take new work until its memory is reset
    _r("ecc-dram-uncorrectable", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    _r("ecc-sram-uncorrectable", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    # corrected errors are informational; a burst is worth a look
    _r("ecc-dram-correctable", INFO, OBSERVE, rate=1),
    _r("ecc-dram-correctable", WARNING, NODE_CONDITION, rate=1000),
    _r("ecc-sram-correctable", INFO, OBSERVE, rate=1),
    _r("ecc-sram-correctable", WARNING, NODE_CONDITION, rate=1000),
    _r("ecc-retired-pages", WARNING, NODE_CONDITION, threshold=64),
    _r("pci-aer-ue", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    _r("pci-aer-ce", INFO, OBSERVE, rate=1),
    _r("pci-synfld", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    _r("pci-dbe", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    _r("pci-mmio", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    _r("ras-uncorrected", CRITICAL, DEVICE_UNHEALTHY, threshold=1),
    _r("ras-corrected", INFO, OBSERVE, rate=1),
    _r("mxlk-aer-ue", WARNING, NODE_CONDITION, threshold=1),
    _r("mxlk-aer-ce", INFO, OBSERVE, rate=1),
    # an EID is an event: it counts while it is recent (within the window)
    _r("eid-driver", WARNING, NODE_CONDITION, rate=1, window=600),
    _r("eid-sdk", INFO, OBSERVE, rate=1, window=600),
)
DEFAULT_POLICY = Policy(DEFAULT_RULES)


def validate_rule(rule: Rule) -> None:
    where = "rule %s" % rule.signal
    if rule.signal not in SIGNALS:
        raise PolicyError("%s: unknown signal (known: %s)" % (where, ", ".join(SIGNALS)))
    if rule.severity not in SEVERITIES:
        raise PolicyError("%s: severity %r is not one of %s" % (where, rule.severity, ", ".join(SEVERITIES)))
    if rule.action not in ACTIONS:
        raise PolicyError("%s: action %r is not one of %s" % (where, rule.action, ", ".join(ACTIONS)))
    if (rule.threshold is None) == (rule.rate is None):
        raise PolicyError("%s: give exactly one of threshold and rate" % where)
    for name, value in (("threshold", rule.threshold), ("rate", rule.rate)):
        if value is not None and value < 1:
            raise PolicyError("%s: %s must be 1 or more, not %d" % (where, name, value))
    if rule.window_seconds < 1:
        raise PolicyError("%s: windowSeconds must be 1 or more" % where)
    if rule.hold_off_seconds is not None and rule.hold_off_seconds < 0:
        raise PolicyError("%s: holdOffSeconds must be 0 or more" % where)
    if rule.recovery_readings is not None and rule.recovery_readings < 1:
        raise PolicyError("%s: recoveryReadings must be 1 or more" % where)
    if rule.action == QUARANTINE:
        if rule.effect not in EFFECTS:
            raise PolicyError("%s: a quarantine needs effect NoSchedule or NoExecute, not %r" % (where, rule.effect))
        if rule.severity == INFO:
            raise PolicyError("%s: an informational row never quarantines (severity info, action quarantine)" % where)
        if rule.signal in CORRECTABLE_SIGNALS and rule.threshold is not None:
            raise PolicyError("%s: corrected errors are informational: quarantine on a rate of them, "
                              "not on a threshold of the counter" % where)
    elif rule.effect is not None:
        raise PolicyError("%s: effect is for action quarantine only" % where)
    if rule.remediate and (rule.severity == INFO or ACTIONS.index(rule.action) < ACTIONS.index(NODE_CONDITION)):
        # the ladder reads the findings of a False condition: an observed signal never takes a node out
        raise PolicyError("%s: remediate needs a row that fails the node condition (action node-condition or "
                          "stronger, severity warning or critical)" % where)


def _int(doc: Mapping[str, Any], key: str, where: str, default: Optional[int]) -> Optional[int]:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError("%s: %s must be a whole number, not %r" % (where, key, value))
    return value


RULE_KEYS = frozenset({"signal", "severity", "action", "threshold", "rate", "windowSeconds", "effect", "remediate",
                       "holdOffSeconds", "recoveryReadings"})
POLICY_KEYS = frozenset({"holdOffSeconds", "recoveryReadings", "eid", "rules", "remediation"})
REMEDIATION_KEYS = frozenset({"maxNodes", "evictTimeoutSeconds", "settleSeconds", "rebootSentinel"})


def parse_remediation(doc: Any, base: Remediation = Remediation()) -> Remediation:
    """The ``remediation`` section over ``base``; PolicyError names what is wrong."""
    if doc is None:
        return base
    if not isinstance(doc, Mapping) or set(doc) - REMEDIATION_KEYS:
        raise PolicyError("remediation holds %s only" % ", ".join(sorted(REMEDIATION_KEYS)))
    values = {}
    for key, least in (("maxNodes", 1), ("evictTimeoutSeconds", 1), ("settleSeconds", 0)):
        value = _int(doc, key, "remediation", None)
        if value is not None and value < least:
            raise PolicyError("remediation.%s must be %d or more" % (key, least))
        values[key] = value
    sentinel = doc.get("rebootSentinel", base.reboot_sentinel)
    if not isinstance(sentinel, str) or ".." in sentinel.split("/"):
        raise PolicyError("remediation.rebootSentinel must be a path under the host root (or \"\")")
    return Remediation(max_nodes=values["maxNodes"] or base.max_nodes,
                       evict_timeout_seconds=values["evictTimeoutSeconds"] or base.evict_timeout_seconds,
                       settle_seconds=base.settle_seconds if values["settleSeconds"] is None
                       else values["settleSeconds"],
                       reboot_sentinel=sentinel.strip().lstrip("/"))


def parse_rule(doc: Any, index: int) -> Rule:
    where = "rules[%d]" % index
    if not isinstance(doc, Mapping):
        raise PolicyError("%s: a rule is a mapping, not %r" % (where, doc))
    unknown = set(doc) - RULE_KEYS
    if unknown:
        raise PolicyError("%s: unknown key(s) %s (known: %s)" % (where, ", ".join(sorted(unknown)),
                                                                 ", ".join(sorted(RULE_KEYS))))
    for key in ("signal", "severity", "action"):
        if not isinstance(doc.get(key), str):
            raise PolicyError("%s: %s is required (a string)" % (where, key))
    remediate = doc.get("remediate", False)
    if not isinstance(remediate, bool):
        raise PolicyError("%s: remediate is true or false" % where)
    rule = Rule(signal=doc["signal"], severity=doc["severity"], action=doc["action"],
                threshold=_int(doc, "threshold", where, None), rate=_int(doc, "rate", where, None),
                window_seconds=_int(doc, "windowSeconds", where, DEFAULT_WINDOW) or 0,
                effect=doc.get("effect"), remediate=remediate,
                hold_off_seconds=_int(doc, "holdOffSeconds", where, None),
                recovery_readings=_int(doc, "recoveryReadings", where, None))
    try:
        validate_rule(rule)
    except PolicyError as exc:
        raise PolicyError("%s (%s)" % (exc, where))
    return rule


def parse_policy(doc: Optional[Mapping[str, Any]], base: Policy = DEFAULT_POLICY) -> Policy:
    """``base`` changed by a policy document (None or {}: ``base`` itself); PolicyError names what is wrong.

    The rows of a signal the document names replace every default row of that
    signal; the other signals keep theirs.
    """
    if not doc:
        return base
    if not isinstance(doc, Mapping):
        raise PolicyError("the health policy is a mapping, not %r" % (doc,))
    unknown = set(doc) - POLICY_KEYS
    if unknown:
        raise PolicyError("unknown key(s) %s (known: %s)" % (", ".join(sorted(unknown)), ", ".join(sorted(POLICY_KEYS))))
    hold_off = _int(doc, "holdOffSeconds", "policy", base.hold_off_seconds)
    readings = _int(doc, "recoveryReadings", "policy", base.recovery_readings)
    if hold_off is None or hold_off < 0:
        raise PolicyError("holdOffSeconds must be 0 or more")
    if readings is None or readings < 1:
        raise PolicyError("recoveryReadings must be 1 or more")
    eid = doc.get("eid") or {}
    if not isinstance(eid, Mapping) or set(eid) - {"pattern", "logFiles"}:
        raise PolicyError("eid holds pattern and logFiles only")
    pattern = eid.get("pattern", base.eid_pattern)
    if not isinstance(pattern, str):
        raise PolicyError("eid.pattern must be a string")
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        raise PolicyError(str(exc))
    files = eid.get("logFiles", list(base.log_files))
    if not isinstance(files, list) or not all(isinstance(f, str) and f.strip() for f in files):
        raise PolicyError("eid.logFiles must be a list of paths")
    given = doc.get("rules") or []
    if not isinstance(given, list):
        raise PolicyError("rules must be a list")
    rules: List[Rule] = [parse_rule(r, i) for i, r in enumerate(given)]
    remediation = parse_remediation(doc.get("remediation"), base.remediation)
    named = {r.signal for r in rules}
    kept = [r for r in base.rules if r.signal not in named]
    return Policy(rules=tuple(kept + rules), hold_off_seconds=hold_off, recovery_readings=readings,
                  eid_pattern=pattern, log_files=tuple(f.lstrip("/") for f in files), remediation=remediation)


def policy_document(policy: Policy = DEFAULT_POLICY) -> Dict[str, Any]:
    """The policy as the document :func:`parse_policy` reads (docs, chart defaults, tests)."""
    rows = []
    for rule in policy.rules:
        row: Dict[str, Any] = {"signal": rule.signal}
        if rule.threshold is not None:
            row["threshold"] = rule.threshold
        else:
            row["rate"] = rule.rate
            row["windowSeconds"] = rule.window_seconds
        row["severity"] = rule.severity
        row["action"] = rule.action
        if rule.effect:
            row["effect"] = rule.effect
        if rule.remediate:
            row["remediate"] = True
        if rule.hold_off_seconds is not None:
            row["holdOffSeconds"] = rule.hold_off_seconds
        if rule.recovery_readings is not None:
            row["recoveryReadings"] = rule.recovery_readings
        rows.append(row)
    fix = policy.remediation
    return {"holdOffSeconds": policy.hold_off_seconds, "recoveryReadings": policy.recovery_readings,
            "eid": {"pattern": policy.eid_pattern, "logFiles": list(policy.log_files)},
            "remediation": {"maxNodes": fix.max_nodes, "evictTimeoutSeconds": fix.evict_timeout_seconds,
                            "settleSeconds": fix.settle_seconds, "rebootSentinel": fix.reboot_sentinel},
            "rules": rows}


def with_rules(policy: Policy, *rules: Rule) -> Policy:
    """``policy`` with ``rules`` replacing the rows of their signals (tests, the operator's merge)."""
    for rule in rules:
        validate_rule(rule)
    named = {r.signal for r in rules}
    return replace(policy, rules=tuple(r for r in policy.rules if r.signal not in named) + tuple(rules))
