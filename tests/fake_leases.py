"""coordination.k8s.io/v1 Leases as the API server answers them, in memory, for unit tests of
plugins/module_utils/kube/slots.py and its users: create of an existing name is 409, replace and
delete with a stale resourceVersion are 409, every call recorded in ``calls``. :meth:`FakeLeaseApi.watch`
feeds a Slots' view the way driver-manager's watch of the pool does: the list, then every write's
event, delivered at once to every watcher."""
from __future__ import annotations

import copy
import itertools
import threading

from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException


def _error(status, reason):
    exc = ApiException()
    exc.status, exc.reason = status, reason
    return exc


class FakeLeaseApi:
    def __init__(self):
        self.leases = {}                 # (namespace, name) -> the Lease's JSON, as the API server keeps it
        self.calls = []                  # (verb, name)
        self._versions = itertools.count(100)
        self.watchers = []               # Slots fed by watch()
        self.lock = threading.RLock()    # one write at a time, as etcd orders them

    def watch(self, slots):
        """``slots`` sees the pool's list now and every write's event from now on."""
        slots.relisted([o for (ns, _n), o in sorted(self.leases.items()) if ns == slots.namespace])
        self.watchers.append(slots)

    def _event(self, kind, obj):
        for slots in self.watchers:
            slots.seen(kind, obj)

    def _object(self, body):
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return obj

    def list_namespaced_lease(self, namespace, label_selector):
        self.calls.append(("list", label_selector))
        key, value = label_selector.split("=", 1)
        return {"items": [o for (ns, _n), o in sorted(self.leases.items())
                          if ns == namespace and (o["metadata"].get("labels") or {}).get(key) == value]}

    def create_namespaced_lease(self, namespace, body):
        with self.lock:
            name = body["metadata"]["name"]
            self.calls.append(("create", name))
            if (namespace, name) in self.leases:
                raise _error(409, "AlreadyExists")
            self.leases[(namespace, name)] = self._object(body)
            self._event("ADDED", self.leases[(namespace, name)])
            return self.leases[(namespace, name)]

    def replace_namespaced_lease(self, name, namespace, body):
        with self.lock:
            self.calls.append(("replace", name))
            have = self.leases.get((namespace, name))
            if have is None:
                raise _error(404, "NotFound")
            if body["metadata"].get("resourceVersion") != have["metadata"]["resourceVersion"]:
                raise _error(409, "Conflict")
            self.leases[(namespace, name)] = self._object(body)
            self._event("MODIFIED", self.leases[(namespace, name)])
            return self.leases[(namespace, name)]

    def delete_namespaced_lease(self, name, namespace, body=None):
        with self.lock:
            self.calls.append(("delete", name))
            have = self.leases.get((namespace, name))
            if have is None:
                raise _error(404, "NotFound")
            wanted = ((body or {}).get("preconditions") or {}).get("resourceVersion")
            if wanted and wanted != have["metadata"]["resourceVersion"]:
                raise _error(409, "Conflict")
            self._event("DELETED", self.leases.pop((namespace, name)))
