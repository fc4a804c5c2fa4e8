{{/* Common labels of every object of this release. */}}
{{- define "metax-gpu.labels" -}}
app.kubernetes.io/part-of: metax-gpu-extensions
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Image of one component: registry/name:tag. Argument: (list $ "gpu-device"). */}}
{{- define "metax-gpu.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.registry) $name (default $root.Chart.AppVersion $root.Values.imageTag) -}}
{{- end -}}

{{/* A component's log options: its own members (even "") over the global ones (Table 2.5). Argument: (list $ .Values.gpuDevice.log). */}}
{{- define "metax-gpu.logArgs" -}}
{{- $root := index . 0 -}}
{{- $log := deepCopy $root.Values.log -}}
{{- range $k, $v := (index . 1 | default dict) }}{{ $_ := set $log $k $v }}{{ end -}}
{{- $hours := dict "w" 168 "d" 24 "h" 1 -}}
{{- $rot := mul (atoi (trimSuffix "w" (trimSuffix "d" (trimSuffix "h" (toString $log.rotationTime))))) (get $hours (substr (int (sub (len (toString $log.rotationTime)) 1)) -1 (toString $log.rotationTime))) -}}
{{- $age := mul (atoi (trimSuffix "w" (trimSuffix "d" (trimSuffix "h" (toString $log.maxAge))))) (get $hours (substr (int (sub (len (toString $log.maxAge)) 1)) -1 (toString $log.maxAge))) -}}
{{- if lt $age $rot -}}
{{- fail (printf "log options: maxAge (%s) is shorter than rotationTime (%s)" $log.maxAge $log.rotationTime) -}}
{{- end }}
- --log-dir={{ $log.dir }}
- --log-level={{ $log.level }}
- --log-format={{ $log.format }}
- --log-rotation-time={{ $log.rotationTime }}
- --log-max-age={{ $log.maxAge }}
{{- end -}}

{{/* The effective log directory of a component ("" = stderr only). */}}
{{- define "metax-gpu.logDir" -}}
{{- $root := index . 0 -}}
{{- $log := deepCopy $root.Values.log -}}
{{- range $k, $v := (index . 1 | default dict) }}{{ $_ := set $log $k $v }}{{ end -}}
{{- $log.dir -}}
{{- end -}}

{{/* The node's root on the host as the kubelet sees it (the --host-prefix), $(NODE_NAME) expanded by the kubelet. */}}
{{- define "metax-gpu.hostPrefix" -}}
{{- if .Values.hostRoot.subPathExpr -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.hostRoot.path) .Values.hostRoot.subPathExpr -}}
{{- else -}}
{{- .Values.hostRoot.path -}}
{{- end -}}
{{- end -}}

{{/* The node root, read-only at /host (argument: $). Whole, because discovery
runs the node's own mx-smi (health, MetaXLink) with its libraries, not only sysfs. */}}
{{- define "metax-gpu.hostRootMounts" -}}
- name: host-root
  mountPath: /host
  readOnly: true
  {{- with $.Values.hostRoot.subPathExpr }}
  subPathExpr: {{ . | quote }}
  {{- end }}
{{- end -}}

{{/* Pod-level settings the node agents share. A node labelled
metax-tech.com/agents.paused (the driver_upgrade and set_vfnum playbooks set it)
runs none of them: the DaemonSet controller removes the pods, so gpu-label cannot
put the labels back mid-procedure and gpu-device releases the devices. */}}
{{- define "metax-gpu.nodePodCommon" -}}
{{- include "metax-gpu.nodePodCommonWith" (list . list) -}}
{{- end -}}

{{/* nodePodCommon with more node-affinity expressions ANDed to the pause: (list $ EXPRESSIONS). */}}
{{- define "metax-gpu.nodePodCommonWith" -}}
{{- $root := index . 0 -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: metax-tech.com/agents.paused
              operator: DoesNotExist
            {{- range index . 1 }}
            - {{ toJson . }}
            {{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* One mode per node (docs/dra.md): the node-affinity expression of the device plugin
(operator NotIn: nodes without the label too) or of gpu-dra (In). Argument: the operator. */}}
{{- define "metax-gpu.deviceModeExpression" -}}
{{- toJson (dict "key" "metax-tech.com/gpu.device-mode" "operator" . "values" (list "dra")) -}}
{{- end -}}

{{/* Security context of an unprivileged agent: non-root unless it must write a root-owned host log directory. Argument: log dir. */}}
{{- define "metax-gpu.unprivileged" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- if . }}
# Writes its log files to the root-owned host directory {{ . }}: uid 0, no capabilities.
runAsUser: 0
{{- else }}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* hostPath volume of a log directory (argument: dir). */}}
{{- define "metax-gpu.logVolume" -}}
{{- if . }}
- name: log
  hostPath:
    path: {{ . }}
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{- define "metax-gpu.logMount" -}}
{{- if . }}
- name: log
  mountPath: {{ . }}
{{- end }}
{{- end -}}
