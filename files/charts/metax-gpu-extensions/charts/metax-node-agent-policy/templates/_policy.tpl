{{/*
The node-agent admission policy (issue 30, docs/security.md).

RBAC can grant "patch nodes" but cannot say "this node" or "these keys". A
ValidatingAdmissionPolicy can: the kubelet's projected service-account token
names the node its pod runs on (request.userInfo.extra
"authentication.kubernetes.io/node-name", on by default since Kubernetes
1.30), and CEL compares the new Node with the old one. An agent's update of a
Node is admitted only when
  - the Node is the one its pod runs on;
  - spec, status, finalizers and owner references are unchanged, except
    that an agent owning condition types or taint keys (gpu-device: the
    MetaXGPUHealthy condition and the metax-tech.com/gpu-health taint, issue
    42) may change status.conditions of those types and spec.taints of those
    keys, nothing else of either (the other fields of spec and status are
    compared one by one: those of every Kubernetes release the policy is
    rendered for); an agent owning spec.unschedulable (driver-manager's
    remediation ladder, issue 42) may cordon its node only when the same
    update records the cordon as the maintenance protocol's own
    (maintenance.cordon=ours), and uncordon it only when the cordon was so
    recorded: an administrator's cordon is never lifted by an agent;
  - every label and annotation it adds, changes or removes is under
    metax-tech.com/ and is one the agent owns (names.py NODE_AGENT_KEYS,
    generated into _keys.tpl).
Everyone else (administrators, the kubelet, controllers, the day-two
playbooks) is outside the policy: matchConditions select the agents' own
service accounts only.

A second policy, <name>-pods, confines the pods a node agent deletes to the
pods of its own node (driver-manager deletes its node's gpu-device pod after
a vfnum or driver change; RBAC cannot say "this node"): on DELETE the
apiserver hands the policy the pod being deleted (oldObject), and its
spec.nodeName must be the token's node. A delete without one (deletecollection)
is denied. Evictions (pods/eviction) are not covered here: the Eviction names
only the pod, and a policy cannot look the pod up; the eviction guard, an
admission webhook, does (_eviction_guard.tpl, docs/security.md).

A third policy, <name>-resourceslices, rendered when one of the agents writes
ResourceSlices (names.py NODE_AGENT_RESOURCE_SLICES: gpu-dra), lets such an
agent create, update and delete only the slices of its own driver whose
spec.nodeName is the token's node, before and after the change: a DRA driver's
token cannot publish or withdraw devices of another node (RBAC can only grant
"resourceslices", any node). A delete naming no one slice (deletecollection)
is denied.

Usage, from a chart that lists this library chart as a dependency:

  {{- include "metax-node-agent-policy.objects" (dict
        "root" $
        "name" "metax-gpu-node-agents"
        "serviceAccounts" (dict "gpu-device" "gpu-device" "gpu-label" "gpu-label")
        "enabled" .Values.nodeAgentPolicy.enabled
        "labels" (include "my-chart.labels" .)) }}

serviceAccounts maps an agent of NODE_AGENT_KEYS to the name of its service
account in the release namespace. enabled: "auto" (rendered when the API
server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy and is
1.30 or newer), true (always) or false (never: RBAC only).
*/}}

{{/* "true" when the policy is to be rendered (see above); "" otherwise. */}}
{{- define "metax-node-agent-policy.enabled" -}}
{{- $enabled := .enabled -}}
{{- if kindIs "bool" $enabled -}}
{{- if $enabled }}true{{ end -}}
{{- else if eq (toString $enabled) "auto" -}}
{{- /* v1 (GA) is served from 1.30, the release that also turned the token's node-name extra on by default. */ -}}
{{- if and (.root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30.0-0" .root.Capabilities.KubeVersion.Version) }}true{{ end -}}
{{- else -}}
{{- fail (printf "nodeAgentPolicy.enabled must be auto, true or false, not %v" $enabled) -}}
{{- end -}}
{{- end -}}

{{/* The policy and its binding (see above). */}}
{{- define "metax-node-agent-policy.objects" -}}
{{- if include "metax-node-agent-policy.enabled" . -}}
{{- $root := .root -}}
{{- $data := include "metax-node-agent-policy.keys" . | fromJson -}}
{{- $prefix := $data.prefix -}}
{{- $users := list -}}
{{- $agentOf := dict -}}
{{- range $agent, $sa := .serviceAccounts -}}
{{- if not (hasKey $data.agents $agent) -}}
{{- fail (printf "node-agent policy: %s is not a node agent of names.py NODE_AGENT_KEYS (known: %s)" $agent (keys $data.agents | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $user := printf "system:serviceaccount:%s:%s" $root.Release.Namespace $sa -}}
{{- $users = append $users $user -}}
{{- $_ := set $agentOf $user $agent -}}
{{- end -}}
{{- /* key -> owning agents, over every agent of the table, so a denial names the owner
(a names.py SHARED_NODE_KEYS key has two: the deployment gives it one writer) */ -}}
{{- $labelOwners := dict -}}
{{- $annotationOwners := dict -}}
{{- range $agent, $keys := $data.agents -}}
{{- range $keys.labels }}{{ $_ := set $labelOwners . (append (get $labelOwners . | default list) $agent) }}{{ end -}}
{{- range $keys.annotations }}{{ $_ := set $annotationOwners . (append (get $annotationOwners . | default list) $agent) }}{{ end -}}
{{- end -}}
{{- /* agent -> the condition types / taint keys it owns (most own none) */ -}}
{{- $conditionsOf := dict -}}
{{- $taintsOf := dict -}}
{{- $specOf := dict -}}
{{- range $agent, $keys := $data.agents -}}
{{- $_ := set $conditionsOf $agent ($keys.conditions | default list) -}}
{{- $_ := set $taintsOf $agent ($keys.taints | default list) -}}
{{- $_ := set $specOf $agent ($keys.spec | default list) -}}
{{- end -}}
{{- $cordonKey := (($data.cordonRecord | default dict).key | default "") -}}
{{- $cordonOurs := (($data.cordonRecord | default dict).ours | default "") -}}
{{- /* Node fields compared one by one for an agent that owns conditions or taints (in every
release since 1.11; a field the apiserver's schema lacks would not compile) */ -}}
{{- $specFields := list "podCIDR" "podCIDRs" "providerID" "unschedulable" "configSource" "externalID" -}}
{{- $statusFields := list "capacity" "allocatable" "phase" "addresses" "daemonEndpoints" "nodeInfo" "images" "volumesInUse" "volumesAttached" "config" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  {{- with .labels }}
  labels:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  # An expression that cannot be evaluated denies: an agent's write is refused
  # rather than let through unchecked.
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: [UPDATE]
        # nodes/status too: no agent may write it (RBAC does not grant it either)
        resources: [nodes, nodes/status]
  matchConditions:
    # the node agents' own service accounts only
    - name: node-agent-service-account
      expression: |-
        request.userInfo.username in {{ toJson $users }}
  variables:
    - name: agent
      expression: |-
        {{ toJson $agentOf }}[request.userInfo.username]
    # the pod's node, from its bound service-account token ("" when the token names none)
    - name: nodeName
      expression: |-
        has(request.userInfo.extra) && "authentication.kubernetes.io/node-name" in request.userInfo.extra && size(request.userInfo.extra["authentication.kubernetes.io/node-name"]) == 1 ? request.userInfo.extra["authentication.kubernetes.io/node-name"][0] : ""
    - name: labelOwners
      expression: |-
        {{ toJson $labelOwners }}
    - name: annotationOwners
      expression: |-
        {{ toJson $annotationOwners }}
    - name: ownedConditions
      expression: |-
        {{ toJson $conditionsOf }}[variables.agent]
    - name: ownedTaints
      expression: |-
        {{ toJson $taintsOf }}[variables.agent]
    - name: ownedSpec
      expression: |-
        {{ toJson $specOf }}[variables.agent]
    # the other fields of spec and status unchanged (for an agent owning conditions or taints)
    - name: otherSpecUnchanged
      expression: |-
        has(object.spec) == has(oldObject.spec) && (!has(object.spec) || ({{ range $i, $f := $specFields }}{{ if $i }} && {{ end }}{{ if eq $f "unschedulable" }}("unschedulable" in variables.ownedSpec || {{ end }}has(object.spec.{{ $f }}) == has(oldObject.spec.{{ $f }}) && (!has(object.spec.{{ $f }}) || object.spec.{{ $f }} == oldObject.spec.{{ $f }}){{ if eq $f "unschedulable" }}){{ end }}{{ end }}))
    - name: otherStatusUnchanged
      expression: |-
        has(object.status) == has(oldObject.status) && (!has(object.status) || ({{ range $i, $f := $statusFields }}{{ if $i }} && {{ end }}has(object.status.{{ $f }}) == has(oldObject.status.{{ $f }}) && (!has(object.status.{{ $f }}) || object.status.{{ $f }} == oldObject.status.{{ $f }}){{ end }}))
    # taints and conditions that are not the agent's, before and after
    - name: otherTaintsUnchanged
      expression: |-
        object.spec.?taints.orValue([]).filter(t, !(t.key in variables.ownedTaints)) == oldObject.spec.?taints.orValue([]).filter(t, !(t.key in variables.ownedTaints))
    - name: otherConditionsUnchanged
      expression: |-
        object.status.?conditions.orValue([]).filter(c, !(c.type in variables.ownedConditions)) == oldObject.status.?conditions.orValue([]).filter(c, !(c.type in variables.ownedConditions))
    - name: oldLabels
      expression: oldObject.metadata.?labels.orValue({})
    - name: newLabels
      expression: object.metadata.?labels.orValue({})
    - name: oldAnnotations
      expression: oldObject.metadata.?annotations.orValue({})
    - name: newAnnotations
      expression: object.metadata.?annotations.orValue({})
    # keys added, changed or removed by this request
    - name: changedLabels
      expression: |-
        variables.newLabels.filter(k, !(k in variables.oldLabels) || variables.oldLabels[k] != variables.newLabels[k]) + variables.oldLabels.filter(k, !(k in variables.newLabels))
    - name: changedAnnotations
      expression: |-
        variables.newAnnotations.filter(k, !(k in variables.oldAnnotations) || variables.oldAnnotations[k] != variables.newAnnotations[k]) + variables.oldAnnotations.filter(k, !(k in variables.newAnnotations))
    # a cordon change only beside the maintenance protocol's record that the cordon is the procedure's own
    - name: cordonRecorded
      expression: |-
        object.spec.?unschedulable.orValue(false) == oldObject.spec.?unschedulable.orValue(false) || ("unschedulable" in variables.ownedSpec && (object.spec.?unschedulable.orValue(false) ? ({{ toJson $cordonKey }} in variables.newAnnotations && variables.newAnnotations[{{ toJson $cordonKey }}] == {{ toJson $cordonOurs }}) : ({{ toJson $cordonKey }} in variables.oldAnnotations && variables.oldAnnotations[{{ toJson $cordonKey }}] == {{ toJson $cordonOurs }})))
  validations:
    - expression: variables.nodeName != ""
      reason: Forbidden
      message: a node agent may change only the node its pod runs on, and this token names no node
      messageExpression: |-
        variables.agent + " may change only the node its pod runs on, and this token names no node (no authentication.kubernetes.io/node-name: use the pod's own service-account token)"
    - expression: object.metadata.name == variables.nodeName
      reason: Forbidden
      message: a node agent may change only the node its pod runs on
      messageExpression: |-
        variables.agent + " may change only its own node " + variables.nodeName + ", not node " + object.metadata.name
    - expression: |-
        size(variables.ownedTaints) == 0 && size(variables.ownedSpec) == 0 ? has(object.spec) == has(oldObject.spec) && (!has(object.spec) || object.spec == oldObject.spec) : variables.otherSpecUnchanged && variables.otherTaintsUnchanged && variables.cordonRecorded
      reason: Forbidden
      message: a node agent may not change the node's spec (taints, unschedulable, ...) beyond the taints it owns
      messageExpression: |-
        variables.agent + " may not change the spec of node " + object.metadata.name + " (taints, unschedulable, ...): a node agent writes only its own {{ $prefix }} labels and annotations" + (size(variables.ownedTaints) == 0 ? "" : " and its own taints " + variables.ownedTaints.join(", ")) + (size(variables.ownedSpec) == 0 ? "" : ", and cordons or uncordons only with the maintenance record {{ $cordonKey }}={{ $cordonOurs }}")
    - expression: |-
        size(variables.ownedConditions) == 0 ? has(object.status) == has(oldObject.status) && (!has(object.status) || object.status == oldObject.status) : variables.otherStatusUnchanged && variables.otherConditionsUnchanged
      reason: Forbidden
      message: a node agent may not change the node's status beyond the conditions it owns
      messageExpression: |-
        variables.agent + " may not change the status of node " + object.metadata.name + ": a node agent writes only its own {{ $prefix }} labels and annotations" + (size(variables.ownedConditions) == 0 ? "" : " and its own conditions " + variables.ownedConditions.join(", "))
    - expression: |-
        object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) && object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])
      reason: Forbidden
      message: a node agent may not change the node's finalizers or owner references
      messageExpression: |-
        variables.agent + " may not change the finalizers or owner references of node " + object.metadata.name
    - expression: |-
        variables.changedLabels.all(k, k.startsWith("{{ $prefix }}"))
      reason: Forbidden
      message: a node agent may change only {{ $prefix }} labels
      messageExpression: |-
        variables.agent + " may change only {{ $prefix }} labels, not " + variables.changedLabels.filter(k, !k.startsWith("{{ $prefix }}")).join(", ")
    - expression: |-
        variables.changedLabels.all(k, k in variables.labelOwners && variables.agent in variables.labelOwners[k])
      reason: Forbidden
      message: a node agent may change only the labels it owns
      messageExpression: |-
        variables.agent + " may change only the labels it owns: " + variables.changedLabels.filter(k, !(k in variables.labelOwners && variables.agent in variables.labelOwners[k])).map(k, k + (k in variables.labelOwners ? " is owned by " + variables.labelOwners[k].join(" and ") : " is owned by no node agent")).join(", ")
    - expression: |-
        variables.changedAnnotations.all(k, k.startsWith("{{ $prefix }}"))
      reason: Forbidden
      message: a node agent may change only {{ $prefix }} annotations
      messageExpression: |-
        variables.agent + " may change only {{ $prefix }} annotations, not " + variables.changedAnnotations.filter(k, !k.startsWith("{{ $prefix }}")).join(", ")
    - expression: |-
        variables.changedAnnotations.all(k, k in variables.annotationOwners && variables.agent in variables.annotationOwners[k])
      reason: Forbidden
      message: a node agent may change only the annotations it owns
      messageExpression: |-
        variables.agent + " may change only the annotations it owns: " + variables.changedAnnotations.filter(k, !(k in variables.annotationOwners && variables.agent in variables.annotationOwners[k])).map(k, k + (k in variables.annotationOwners ? " is owned by " + variables.annotationOwners[k].join(" and ") : " is owned by no node agent")).join(", ")
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  {{- with .labels }}
  labels:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  policyName: {{ .name }}
  validationActions: [Deny]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}-pods
  {{- with .labels }}
  labels:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: [DELETE]
        resources: [pods]
  matchConditions:
    - name: node-agent-service-account
      expression: |-
        request.userInfo.username in {{ toJson $users }}
  variables:
    - name: agent
      expression: |-
        {{ toJson $agentOf }}[request.userInfo.username]
    - name: nodeName
      expression: |-
        has(request.userInfo.extra) && "authentication.kubernetes.io/node-name" in request.userInfo.extra && size(request.userInfo.extra["authentication.kubernetes.io/node-name"]) == 1 ? request.userInfo.extra["authentication.kubernetes.io/node-name"][0] : ""
    # the pod's node ("" for a delete that names no one pod, or a pod not yet bound)
    - name: podNode
      expression: |-
        oldObject != null ? oldObject.spec.?nodeName.orValue("") : ""
  validations:
    - expression: variables.nodeName != ""
      reason: Forbidden
      message: a node agent may delete only pods of the node its pod runs on, and this token names no node
      messageExpression: |-
        variables.agent + " may delete only pods of the node its pod runs on, and this token names no node (no authentication.kubernetes.io/node-name: use the pod's own service-account token)"
    - expression: variables.podNode == variables.nodeName
      reason: Forbidden
      message: a node agent may delete only pods of the node its pod runs on
      messageExpression: |-
        variables.agent + " may delete only pods of its own node " + variables.nodeName + ", not " + (variables.podNode == "" ? "pods bound to no node or several pods at once" : "a pod of node " + variables.podNode)
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}-pods
  {{- with .labels }}
  labels:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  policyName: {{ .name }}-pods
  validationActions: [Deny]
{{- $sliceUsers := list -}}
{{- $driverOf := dict -}}
{{- range $user, $agent := $agentOf -}}
{{- if hasKey ($data.resourceSlices | default dict) $agent -}}
{{- $sliceUsers = append $sliceUsers $user -}}
{{- $_ := set $driverOf $user (get $data.resourceSlices $agent) -}}
{{- end -}}
{{- end -}}
{{- if $sliceUsers }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}-resourceslices
  {{- with .labels }}
  labels:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [resource.k8s.io]
        apiVersions: ["*"]
        operations: [CREATE, UPDATE, DELETE]
        resources: [resourceslices]
  matchConditions:
    # the node agents that write ResourceSlices (their own service accounts only)
    - name: resource-slice-writer
      expression: |-
        request.userInfo.username in {{ toJson (sortAlpha $sliceUsers) }}
  variables:
    - name: agent
      expression: |-
        {{ toJson $agentOf }}[request.userInfo.username]
    - name: driver
      expression: |-
        {{ toJson $driverOf }}[request.userInfo.username]
    - name: nodeName
      expression: |-
        has(request.userInfo.extra) && "authentication.kubernetes.io/node-name" in request.userInfo.extra && size(request.userInfo.extra["authentication.kubernetes.io/node-name"]) == 1 ? request.userInfo.extra["authentication.kubernetes.io/node-name"][0] : ""
    # the slice's node after the request (not on DELETE) and before it (not on CREATE; a delete
    # naming no one slice, a deletecollection, has no old object: "")
    - name: newNode
      expression: |-
        request.operation == "DELETE" ? "" : object.spec.?nodeName.orValue("")
    - name: oldNode
      expression: |-
        request.operation == "CREATE" || oldObject == null ? "" : oldObject.spec.?nodeName.orValue("")
  validations:
    - expression: variables.nodeName != ""
      reason: Forbidden
      message: a node agent may write only ResourceSlices of the node its pod runs on, and this token names no node
      messageExpression: |-
        variables.agent + " may write only ResourceSlices of the node its pod runs on, and this token names no node (no authentication.kubernetes.io/node-name: use the pod's own service-account token)"
    - expression: |-
        request.operation == "DELETE" || variables.newNode == variables.nodeName
      reason: Forbidden
      message: a node agent may write only the ResourceSlices of its own node
      messageExpression: |-
        variables.agent + " may write only the ResourceSlices of its own node " + variables.nodeName + ", not a slice of " + (variables.newNode == "" ? "no node" : "node " + variables.newNode)
    - expression: |-
        request.operation == "CREATE" || variables.oldNode == variables.nodeName
      reason: Forbidden
      message: a node agent may change or delete only the ResourceSlices of its own node
      messageExpression: |-
        variables.agent + " may change or delete only the ResourceSlices of its own node " + variables.nodeName + ", not " + (variables.oldNode == "" ? "several slices at once or a slice of no node" : "a slice of node " + variables.oldNode)
    - expression: |-
        request.operation == "DELETE" || object.spec.driver == variables.driver
      reason: Forbidden
      message: a node agent may write only the ResourceSlices of its own driver
      messageExpression: |-
        variables.agent + " may write only ResourceSlices of driver " + variables.driver
    - expression: |-
        request.operation == "CREATE" || (oldObject != null && oldObject.spec.driver == variables.driver)
      reason: Forbidden
      message: a node agent may change or delete only the ResourceSlices of its own driver
      messageExpression: |-
        variables.agent + " may change or delete only ResourceSlices of driver " + variables.driver
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}-resourceslices
  {{- with .labels }}
  labels:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  policyName: {{ .name }}-resourceslices
  validationActions: [Deny]
{{- end }}
{{- end -}}
{{- end -}}
