"""Realistic kubeadm kube-scheduler manifests (manifests/) shared by the scheduler tests."""
from __future__ import annotations

import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "manifests")
VERSIONS = ("1.23", "1.25", "1.28", "1.32")
CONFIG_PATH = "/etc/metax/extender.yaml"
URL = "http://10.96.12.34:8080"


def manifest(name: str) -> str:
    with open(os.path.join(HERE, "kube-scheduler-%s.yaml" % name)) as handle:
        return handle.read()


EXISTING_CONFIG_PATH = "/etc/kubernetes/scheduler-config.yaml"
EXISTING_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
  qps: 100
leaderElection:
  leaderElect: true
  resourceName: kube-scheduler
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
extenders:
- urlPrefix: http://storage-extender.kube-system:8888
  filterVerb: filter
  weight: 1
  managedResources:
  - name: example.com/fast-disk
    ignoredByScheduler: true
"""
