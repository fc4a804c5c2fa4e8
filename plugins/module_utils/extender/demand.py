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
from typing import Any, Dict, Mapping, Optional, Union

from ..errors import MetaxGpuError
from ..names import RESOURCE_NAME


_QUANTITY = re.compile(r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?\s*$")
_BINARY: Dict[str, int] = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL: Dict[str, Union[int, Fraction]] = {
    "n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000),
    "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18,
}


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


def _container_request(container: Any, resource: str) -> int:
    if not isinstance(container, Mapping):
        return 0
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return 0
    for field in ("requests", "limits"):
        values = resources.get(field)
        if isinstance(values, Mapping) and resource in values:
            return quantity_count(values[resource])
    return 0


def _is_sidecar(container: Any) -> bool:
    return isinstance(container, Mapping) and container.get("restartPolicy") == "Always"


def pod_demand(pod: Optional[Mapping[str, Any]], resource: str = RESOURCE_NAME) -> int:
    """How many ``resource`` devices the pod needs on one node (kube-scheduler's rule)."""
    if not isinstance(pod, Mapping):
        return 0
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0
    total = 0
    for container in spec.get("containers") or ():
        total += _container_request(container, resource)
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or ():
        request = _container_request(container, resource)
        if _is_sidecar(container):
            total += request
            sidecars += request
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, request + sidecars)
    demand = max(total, init_peak)
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping) and resource in overhead:
        demand += quantity_count(overhead[resource])
    return demand
