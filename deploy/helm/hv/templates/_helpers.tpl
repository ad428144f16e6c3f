{{- define "hv.labels" -}}
app.kubernetes.io/name: hv
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "hv.coordinator.selector" -}}
app.kubernetes.io/name: hv
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "hv.agent.selector" -}}
app.kubernetes.io/name: hv
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "hv.coordinator.name" -}}{{ .Release.Name }}-coordinator{{- end -}}
{{- define "hv.agent.name" -}}{{ .Release.Name }}-agent{{- end -}}

{{- define "hv.image" -}}
{{ .image.repository }}:{{ .image.tag | default .chart.AppVersion }}
{{- end -}}

{{/* No privilege, no capability, nothing written but /tmp. (The agent still needs a
namespace whose pod security admits hostNetwork and hostPath: privileged.) */}}
{{- define "hv.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* A matchLabels map as a --protected-pods selector: k=v,k2=v2 (sorted). */}}
{{- define "hv.selectorArg" -}}
{{- $terms := list -}}
{{- range $k, $v := . -}}{{- $terms = append $terms (printf "%s=%s" $k $v) -}}{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{/* The namespaces of the protected and dependent pods, with the release's own
(the agent's pods): the coordinator reads and labels pods there only. A JSON list. */}}
{{- define "hv.guardNamespace" -}}{{ .Values.coordinator.drainGuard.namespace | default .Release.Namespace }}{{- end -}}
{{- define "hv.podNamespaces" -}}
{{- $namespaces := list -}}
{{- if .Values.coordinator.drainProtection.enabled -}}
{{- $namespaces = append $namespaces .Release.Namespace -}}
{{- range .Values.coordinator.drainProtection.protectedPods }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- range .Values.coordinator.drainProtection.dependentPods }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- end -}}
{{- if .Values.coordinator.drainGuard.enabled }}{{ $namespaces = append $namespaces (include "hv.guardNamespace" .) }}{{ end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}
