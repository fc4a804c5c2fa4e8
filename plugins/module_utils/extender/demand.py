# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A pod's demand for ``metax-tech.com/gpu``, computed as kube-scheduler does.

kube-scheduler (``k8s.io/component-helpers/resource.PodRequests``):

* the requests of the regular containers are summed;
* restartable init containers (sidecars, ``restartPolicy: Always``) keep
  running, so they are added to that sum, and each later init container runs
  next to the sidecars started before it;
* a plain init container runs alone (next to those sidecars): the pod needs
  the maximum of the running sum and every init container's peak;
* ``spec.overhead`` is added on top.

Extended resources cannot be overcommitted, so the API server defaults a
missing request to the limit; this module does the same for pods that did not
pass through the API server (tests, hand-written bodies).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from ..errors import MetaxGpuError
from ..names import RESOURCE_NAME


_QUANTITY = re.compile(r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?\s*$")
_BINARY: Dict[str, int] = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL: Dict[str, Union[int, Fraction]] = {
    "n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000),
    "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18,
}


_NO_FIELDS: Mapping[str, Any] = {}


class QuantityError(MetaxGpuError, ValueError):
    """A value is not a Kubernetes resource quantity."""


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes ``resource.Quantity`` (``"2"``, ``"1k"``, ``"500m"``, ``"1e3"``, ``2``) -> exact value."""
    if isinstance(value, bool):
        raise QuantityError("%r is not a quantity" % (value,))
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError("%r is not a quantity" % (value,))
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError("%r is not a quantity" % (value,))
    match = _QUANTITY.match(value)
    if not match:
        raise QuantityError("%r is not a quantity" % (value,))
    sign, number, suffix, exponent = match.groups()
    result = Fraction(number)
    if suffix in _BINARY:
        result *= _BINARY[suffix]
    elif suffix:
        result *= _DECIMAL[suffix]
    elif exponent is not None:
        power = int(exponent)
        if abs(power) > 30:
            raise QuantityError("%r: exponent out of range" % (value,))
        result *= Fraction(10) ** power
    return -result if sign == "-" else result


def quantity_count(value: Any) -> int:
    """A quantity as a device count: rounded up (``Quantity.Value()``), never negative."""
    return max(0, math.ceil(parse_quantity(value)))


class PodSpecError(MetaxGpuError, ValueError):
    """A field of the Pod that gpu-aware reads has the wrong type or value; the message names it."""


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    """``value`` when it is an object, ``{}`` when null or absent (Go decodes null as a nil map)."""
    if value is None:
        return _NO_FIELDS
    if not isinstance(value, Mapping):
        raise PodSpecError("%s: expected an object or null, got %s" % (path, json_type(value)))
    return value


def _array(value: Any, path: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PodSpecError("%s: expected an array or null, got %s" % (path, json_type(value)))
    return value


def _count_at(value: Any, path: str) -> int:
    try:
        return quantity_count(value)
    except QuantityError as exc:
        raise PodSpecError("%s: %s" % (path, exc)) from None


def _container_request(container: Any, resource: str, path: str) -> int:
    if not isinstance(container, Mapping):
        raise PodSpecError("%s: expected an object, got %s" % (path, json_type(container)))
    resources = _mapping(container.get("resources"), path + ".resources")
    for field in ("requests", "limits"):
        values = _mapping(resources.get(field), "%s.resources.%s" % (path, field))
        if resource in values:
            return _count_at(values[resource], '%s.resources.%s["%s"]' % (path, field, resource))
    return 0


def _is_sidecar(container: Mapping[str, Any], path: str) -> bool:
    policy = container.get("restartPolicy")
    if policy is not None and not isinstance(policy, str):
        raise PodSpecError("%s.restartPolicy: expected a string, got %s" % (path, json_type(policy)))
    return policy == "Always"


def pod_demand(pod: Optional[Mapping[str, Any]], resource: str = RESOURCE_NAME) -> int:
    """How many ``resource`` devices the pod needs on one node (kube-scheduler's rule).

    Null or absent fields count as empty, as Go decodes them. A field this
    reads that has the wrong JSON type, or a quantity that does not parse,
    raises :class:`PodSpecError` naming it (``Pod.spec.containers[0]...``):
    kube-scheduler never sends such a Pod, so the request is malformed.
    """
    if pod is None:
        return 0
    spec = _mapping(_mapping(pod, "Pod").get("spec"), "Pod.spec")
    total = 0
    for index, container in enumerate(_array(spec.get("containers"), "Pod.spec.containers")):
        total += _container_request(container, resource, "Pod.spec.containers[%d]" % index)
    sidecars = 0
    init_peak = 0
    for index, container in enumerate(_array(spec.get("initContainers"), "Pod.spec.initContainers")):
        path = "Pod.spec.initContainers[%d]" % index
        request = _container_request(container, resource, path)
        if _is_sidecar(container, path):
            total += request
            sidecars += request
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, request + sidecars)
    demand = max(total, init_peak)
    overhead = _mapping(spec.get("overhead"), "Pod.spec.overhead")
    if resource in overhead:
        demand += _count_at(overhead[resource], 'Pod.spec.overhead["%s"]' % resource)
    return demand
