{{/* Common labels of every object of this release. */}}
{{- define "metax-operator.labels" -}}
app.kubernetes.io/part-of: metax-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "metax-operator.controllerImage" -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .Values.registry) .Values.controller.image (default .Chart.AppVersion .Values.imageTag) -}}
{{- end -}}
