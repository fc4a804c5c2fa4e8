{{/*
The eviction guard (issue 39, docs/security.md): the admission webhook that
admits driver-manager's evictions of its own node's pods only.

RBAC grants pods/eviction create everywhere or nowhere, and a
ValidatingAdmissionPolicy on pods/eviction sees only the Eviction (the pod's
name), never the pod. The webhook reads the pod and compares its
spec.nodeName with the node the requester's bound token names
(userInfo.extra "authentication.kubernetes.io/node-name", as the node-agent
policy does). It is served outside driver-manager (a node must not approve its
own request): by the operator-controller in the GPU Operator chart, by the
Deployment metax-eviction-guard in the GPU Extensions chart
(plugins/module_utils/eviction_webhook.py). Each chart renders the Service
named <name> in front of its server; this template renders the rest:

  - the Secret <name>-tls (kubernetes.io/tls, and ca.crt): a CA and a serving
    certificate for <name>.<namespace>.svc, made once by helm (genCA,
    genSignedCert) and found again by lookup on every upgrade, so the
    certificate and the caBundle stay the same;
  - the ValidatingWebhookConfiguration <namespace>-eviction-guard (cluster-scoped:
    named after the namespace, as the policy): pods/eviction CREATE, only for
    the guarded service accounts (matchConditions), failurePolicy Fail (an
    eviction is refused rather than let through unchecked when the guard is
    down; driver-manager's round retries it with backoff).

  {{- include "metax-node-agent-policy.evictionGuard" (dict
        "root" $
        "name" "metax-eviction-guard"
        "serviceAccounts" (list "driver-manager")
        "port" 443
        "webhook" true
        "labels" (include "my-chart.labels" .)) }}

webhook: render the ValidatingWebhookConfiguration (false: the Secret only,
so that a server mounting it starts; the chart passes whether the node-agent
policy is enabled, whose prerequisite, the token's node claim, is the guard's).
*/}}
{{- define "metax-node-agent-policy.evictionGuard" -}}
{{- $root := .root -}}
{{- $ns := $root.Release.Namespace -}}
{{- $secretName := printf "%s-tls" .name -}}
{{- $host := printf "%s.%s.svc" .name $ns -}}
{{- $ca := "" -}}{{- $crt := "" -}}{{- $key := "" -}}
{{- $found := lookup "v1" "Secret" $ns $secretName -}}
{{- if and $found (hasKey ($found.data | default dict) "ca.crt") (hasKey ($found.data | default dict) "tls.crt") (hasKey ($found.data | default dict) "tls.key") -}}
{{- $ca = index $found.data "ca.crt" -}}
{{- $crt = index $found.data "tls.crt" -}}
{{- $key = index $found.data "tls.key" -}}
{{- else -}}
{{- $gen := genCA (printf "%s-ca" .name) 3650 -}}
{{- $cert := genSignedCert $host nil (list .name (printf "%s.%s" .name $ns) $host (printf "%s.cluster.local" $host)) 3650 $gen -}}
{{- $ca = $gen.Cert | b64enc -}}
{{- $crt = $cert.Cert | b64enc -}}
{{- $key = $cert.Key | b64enc -}}
{{- end -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $secretName }}
  namespace: {{ $ns }}
  labels:
    {{- with .labels }}
    {{- . | nindent 4 }}
    {{- end }}
    app.kubernetes.io/component: eviction-guard
type: kubernetes.io/tls
data:
  ca.crt: {{ $ca }}
  tls.crt: {{ $crt }}
  tls.key: {{ $key }}
{{- if .webhook }}
{{- $users := list -}}
{{- range .serviceAccounts }}{{ $users = append $users (printf "system:serviceaccount:%s:%s" $ns .) }}{{ end }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {{ printf "%s-eviction-guard" $ns }}
  labels:
    {{- with .labels }}
    {{- . | nindent 4 }}
    {{- end }}
    app.kubernetes.io/component: eviction-guard
webhooks:
  - name: eviction-guard.gpu.metax-tech.com
    admissionReviewVersions: [v1]
    sideEffects: None
    # refused, not let through, when the guard cannot answer
    failurePolicy: Fail
    matchPolicy: Equivalent
    timeoutSeconds: 10
    clientConfig:
      service:
        name: {{ .name }}
        namespace: {{ $ns }}
        path: /validate-eviction
        port: {{ .port }}
      caBundle: {{ $ca }}
    rules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: [CREATE]
        resources: [pods/eviction]
        scope: Namespaced
    # the guarded service accounts only: every other eviction (administrators, the
    # disruption controller, kubectl drain) never reaches the guard
    matchConditions:
      - name: guarded-service-account
        expression: |-
          request.userInfo.username in {{ toJson $users }}
{{- end }}
{{- end -}}
