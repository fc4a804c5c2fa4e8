{{/* Common labels of every object of this release. */}}
{{- define "metax-operator.labels" -}}
app.kubernetes.io/part-of: metax-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* The operator-controller's image. A map at controller.image is the real chart's
{registry, name, version, pullPolicy}: accepted, not acted on (IgnoredFields). */ -}}
{{- define "metax-operator.controllerImage" -}}
{{- $name := .Values.controller.image -}}
{{- if not (kindIs "string" $name) }}{{ $name = "operator-controller" }}{{ end -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .Values.registry) $name (default .Chart.AppVersion .Values.imageTag) -}}
{{- end -}}

{{- /* Whether a component section is on: minimal mode wins, then its deploy (absent: on,
as the CRD's default), the meaning of contract.deployed for driver, maca and runtime. */ -}}
{{- define "metax-operator.on" -}}
{{- $root := index . 0 -}}
{{- $section := get $root.Values (index . 1) | default dict -}}
{{- if and (not $root.Values.minimal) (ternary $section.deploy true (hasKey $section "deploy")) }}true{{ end -}}
{{- end -}}

{{- /* A component that is on but lacks what it needs fails the install, naming the value
(mapping.missing_requirements in Python): never a Ready that hides a driver never installed. */ -}}
{{- define "metax-operator.requirements" -}}
{{- $driver := .Values.driver | default dict -}}
{{- if and (include "metax-operator.on" (list . "driver")) (not (($driver.payload | default dict).version | default "")) -}}
{{- fail "driver.payload.version is required: the driver component is on (driver.deploy, true by default as in MetaX's operator) and installs the kernel driver from the payload image <driver.payload.registry>/<driver.payload.name>:<driver.payload.version>. Set it (--set driver.payload.version=2.29.0.13), or driver.deploy=false, or minimal=true where the driver and MXMACA were installed by hand" -}}
{{- end -}}
{{- $maca := .Values.maca | default dict -}}
{{- if and (include "metax-operator.on" (list . "maca")) (not (($maca.payload | default dict).images | default list)) -}}
{{- fail "maca.payload.images is required: the MXMACA component is on (maca.deploy, true by default as in MetaX's operator) and installs MXMACA from one payload image per product. Set it (--set maca.payload.images={mxc500-maca:2.29.0.7-ubuntu22.04-amd64}), or maca.deploy=false, or minimal=true where the driver and MXMACA were installed by hand" -}}
{{- end -}}
{{- end -}}

{{- /* driver.vfnumsConfig as {<node>: {vfnum: N}} (JSON), read from the real chart's
nodes: {<node>: {vfnum: N}} or that flat shape; a "nodes" entry holding vfnum is a node
called nodes (mapping.vfnums_entries in Python). */ -}}
{{- define "metax-operator.vfnums" -}}
{{- $config := (.Values.driver | default dict).vfnumsConfig | default dict -}}
{{- $nested := get $config "nodes" -}}
{{- $out := dict -}}
{{- if and (kindIs "map" $nested) (not (hasKey $nested "vfnum")) -}}
{{- range $k, $val := $config }}{{ if ne $k "nodes" }}{{ $_ := set $out $k $val }}{{ end }}{{ end -}}
{{- range $k, $val := $nested }}{{ $_ := set $out $k $val }}{{ end -}}
{{- else -}}
{{- $out = $config -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
