# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube-scheduler as kubeadm runs it: a static pod of the first node's kubelet.

The manifest is written only when absent: metax.gpu.scheduler_extender
patches this file later, and `up` must not undo that.

One deliberate difference from kubeadm's manifest: the startupProbe checks
/livez every second from the first second (kubeadm: after 10 s, then every
10 s), with the same budget of 240 s. The mirror pod turns Ready only when the
startupProbe has passed, so with kubeadm's timing every restart of the static
pod (`up`, and each change metax.gpu.scheduler_extender makes) was Ready 10 to
20 s after the scheduler already answered /readyz; the tests that wait for Ready
(the scheduler extender's, `up`'s own) waited that out each time. The keys, their
order and the probe paths stay kubeadm's: what scheduler_extender reads and edits.
"""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, Host, Write
from .settings import SCHED_PORT, Settings


def _probe(path: str, port: int) -> str:
    return ("        httpGet:\n"
            "          host: 127.0.0.1\n"
            "          path: %s\n"
            "          port: %d\n"
            "          scheme: HTTPS\n") % (path, port)


def render(image: str, port: int = SCHED_PORT) -> str:
    return ("apiVersion: v1\n"
            "kind: Pod\n"
            "metadata:\n"
            "  labels:\n"
            "    component: kube-scheduler\n"
            "    tier: control-plane\n"
            "  name: kube-scheduler\n"
            "  namespace: kube-system\n"
            "spec:\n"
            "  containers:\n"
            "    - command:\n"
            "        - kube-scheduler\n"
            "        - --authentication-kubeconfig=/etc/kubernetes/scheduler.conf\n"
            "        - --authorization-kubeconfig=/etc/kubernetes/scheduler.conf\n"
            "        - --bind-address=127.0.0.1\n"
            "        - --kubeconfig=/etc/kubernetes/scheduler.conf\n"
            "        - --leader-elect=true\n"
            "      image: %(image)s\n"
            "      imagePullPolicy: IfNotPresent\n"
            "      livenessProbe:\n"
            "        failureThreshold: 8\n"
            "%(livez)s"
            "        initialDelaySeconds: 10\n"
            "        periodSeconds: 10\n"
            "        timeoutSeconds: 15\n"
            "      name: kube-scheduler\n"
            "      readinessProbe:\n"
            "        failureThreshold: 3\n"
            "%(readyz)s"
            "        periodSeconds: 1\n"
            "        timeoutSeconds: 15\n"
            "      resources:\n"
            "        requests:\n"
            "          cpu: 100m\n"
            "      startupProbe:\n"
            "        failureThreshold: 240\n"
            "%(livez)s"
            "        initialDelaySeconds: 1\n"
            "        periodSeconds: 1\n"
            "        timeoutSeconds: 15\n"
            "      volumeMounts:\n"
            "        - mountPath: /etc/kubernetes/scheduler.conf\n"
            "          name: kubeconfig\n"
            "          readOnly: true\n"
            "  hostNetwork: true\n"
            "  priority: 2000001000\n"
            "  priorityClassName: system-node-critical\n"
            "  securityContext:\n"
            "    seccompProfile:\n"
            "      type: RuntimeDefault\n"
            "  volumes:\n"
            "    - hostPath:\n"
            "        path: /etc/kubernetes/scheduler.conf\n"
            "        type: FileOrCreate\n"
            "      name: kubeconfig\n"
            "status: {}\n") % dict(image=image, livez=_probe("/livez", port), readyz=_probe("/readyz", port))


def manifest_file(settings: Settings) -> FileSpec:
    return FileSpec(settings.manifests + "/kube-scheduler.yaml", render(settings.scheduler_image),
                    write=Write.IF_ABSENT)


@dataclass(frozen=True)
class SchedulerComponent:
    """The static pod manifest; ready when the first node's kubelet runs the pod Ready (KUBECTL: its argv
    prefix with the admin kubeconfig). `down` moves the manifest away before the kubelets stop (drain)."""

    settings: Settings
    first_node: str = ""
    kubectl: tuple[str, ...] = ()
    name: str = "kube-scheduler"

    def files(self) -> list[FileSpec]:
        return [manifest_file(self.settings)]

    def up(self, host: Host) -> None:
        host.mkdir(self.settings.manifests)
        for f in self.files():
            host.write(f)

    def ready(self, host: Host) -> bool:
        jsonpath = '{.status.conditions[?(@.type=="Ready")].status}'
        return host.run([*self.kubectl, "-n", "kube-system", "get", "pod", "kube-scheduler-" + self.first_node,
                         "-o", "jsonpath=" + jsonpath]).strip() == "True"

    def down(self, host: Host) -> None:
        """Nothing: the drain moves the manifest away, the teardown plan removes the file."""
