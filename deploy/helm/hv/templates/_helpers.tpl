{{/* The chart's name in the app.kubernetes.io/name label: nameOverride, else hv. */}}
{{- define "hv.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* What every object's name starts with: fullnameOverride, else the release's name
(hv-coordinator, hv-agent for a release hv, as before the override existed). It names
the coordinator's Lease, and so the instance label of every Hypervisor: set it at
install and never change it. */}}
{{- define "hv.fullname" -}}
{{- .Values.fullnameOverride | default .Release.Name -}}
{{- end -}}

{{- define "hv.labels" -}}
app.kubernetes.io/name: {{ include "hv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "hv.coordinator.selector" -}}
app.kubernetes.io/name: {{ include "hv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "hv.agent.selector" -}}
app.kubernetes.io/name: {{ include "hv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "hv.coordinator.name" -}}{{ include "hv.fullname" . }}-coordinator{{- end -}}
{{- define "hv.agent.name" -}}{{ include "hv.fullname" . }}-agent{{- end -}}

{{/* The ServiceAccounts. The coordinator's is bound to its RBAC: without one the chart
makes, it must be named (the namespace's default account would get its rights). */}}
{{- define "hv.coordinator.serviceAccount" -}}
{{- with .Values.coordinator.serviceAccount -}}
{{- if .create -}}{{ .name | default (include "hv.coordinator.name" $) }}
{{- else -}}{{ required "coordinator.serviceAccount.name is required with coordinator.serviceAccount.create false (it gets the coordinator's RBAC)" .name }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- define "hv.agent.serviceAccount" -}}
{{- with .Values.agent.serviceAccount -}}
{{- if .create -}}{{ .name | default (include "hv.agent.name" $) }}{{- else -}}{{ .name | default "default" }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* A pod template's labels: the chart's and the component's (which win), then the
values' podLabels. Arguments: the root context, the component, its podLabels. */}}
{{- define "hv.podLabels" -}}
{{- $root := index . 0 -}}
{{- $own := merge (dict "app.kubernetes.io/component" (index . 1)) (include "hv.labels" $root | fromYaml) -}}
{{- toYaml (merge $own (index . 2 | default dict)) -}}
{{- end -}}

{{/* topologySpreadConstraints as given; one without a labelSelector gets the
component's selector. Arguments: the constraints and the selector (a map). */}}
{{- define "hv.topologySpread" -}}
{{- $out := list -}}
{{- range index . 0 -}}
{{- $c := deepCopy . -}}
{{- if not $c.labelSelector }}{{ $_ := set $c "labelSelector" (dict "matchLabels" (index $ 1)) }}{{ end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* An image: [registry/]repository, then @digest, else :tag (default: the chart's
appVersion). The registry is the image's own, else images.registry, else
global.imageRegistry (a parent chart's). Arguments: dict "image" and "root". */}}
{{- define "hv.image" -}}
{{- $root := .root -}}
{{- $global := $root.Values.global | default dict -}}
{{- $registry := .image.registry | default $root.Values.images.registry | default $global.imageRegistry -}}
{{- $repository := .image.repository -}}
{{- if $registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}{{ end -}}
{{- if .image.digest -}}
{{ $repository }}@{{ .image.digest }}
{{- else -}}
{{ $repository }}:{{ .image.tag | default $root.Chart.AppVersion }}
{{- end -}}
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
(the agent's pods), the drain guards', and the release's with the agents' certificates
from the coordinator: the coordinator reads and labels pods there only. A JSON list.
(The node dependencies' are not among them: hv.dependencyNamespaces.) */}}
{{- define "hv.guardNamespace" -}}{{ .Values.coordinator.drainGuard.namespace | default .Release.Namespace }}{{- end -}}
{{- define "hv.podNamespaces" -}}
{{- $namespaces := list -}}
{{- if .Values.coordinator.drainProtection.enabled -}}
{{- $namespaces = append $namespaces .Release.Namespace -}}
{{- range .Values.coordinator.drainProtection.protectedPods }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- range .Values.coordinator.drainProtection.dependentPods }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- end -}}
{{- if .Values.coordinator.drainGuard.enabled }}{{ $namespaces = append $namespaces (include "hv.guardNamespace" .) }}{{ end -}}
{{- /* The agents' certificates from the coordinator: it reads the pod a token is bound to
(the agent's, in the release's namespace) before it signs. */ -}}
{{- if include "hv.agentIdentityFromCoordinator" . }}{{ $namespaces = append $namespaces .Release.Namespace }}{{ end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}

{{/* The namespaces of the node dependencies' pods (coordinator.nodeDependencies) not
already in hv.podNamespaces: the coordinator only watches pods there (list, watch), never
reads one by name nor patches it. A JSON list. */}}
{{- define "hv.dependencyNamespaces" -}}
{{- $pods := include "hv.podNamespaces" . | fromJsonArray -}}
{{- $namespaces := list -}}
{{- range .Values.coordinator.nodeDependencies -}}
{{- if not (has .namespace $pods) }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}

{{/* The agents' certificates (docs/agent-identity.md). "true" when the coordinator signs
them (agent.identity.from coordinator), empty when they come from a host directory. */}}
{{- define "hv.agentIdentityFromCoordinator" -}}
{{- if eq .Values.agent.identity.from "coordinator" }}true{{ end -}}
{{- end -}}

{{/* The audience of the agents' projected tokens: the coordinator takes only these, and
the API server refuses them. The same on both sides, so fixed here. */}}
{{- define "hv.agentTokenAudience" -}}hv-coordinator{{- end -}}

{{/* The Secret of the CA that signs the agents' certificates: the site's, else the
chart's (certificates.yaml). */}}
{{- define "hv.agentSignerSecret" -}}
{{- .Values.coordinator.identity.signerSecret | default (printf "%s-agent-signer" (include "hv.fullname" .)) -}}
{{- end -}}

{{/* The ConfigMap where the leader publishes the CA of its gRPC certificate (ca.crt),
for the agents. */}}
{{- define "hv.coordinatorCaConfigMap" -}}{{ include "hv.fullname" . }}-coordinator-ca{{- end -}}

{{/* A duration (1h30m, 90s, 500ms) in whole seconds. */}}
{{- define "hv.seconds" -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $n := regexFind "^[0-9]+" . | atoi -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" .) . -}}
{{- if eq $unit "h" }}{{ $total = add $total (mul $n 3600) }}
{{- else if eq $unit "m" }}{{ $total = add $total (mul $n 60) }}
{{- else if eq $unit "s" }}{{ $total = add $total $n }}
{{- else }}{{ $total = add $total (div $n 1000) }}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The BMC credentials' Secrets the coordinator may read (coordinator.fencing.bmcSecrets),
never one of the chart's own key material. A JSON list. */}}
{{- define "hv.bmcSecrets" -}}
{{- $own := list (printf "%s-ca" (include "hv.fullname" .)) (printf "%s-sre-tls" (include "hv.fullname" .)) .Values.coordinator.tlsSecret .Values.openstack.cloudsSecret .Values.coordinator.fencing.ceph.secret (printf "%s-agent-signer" (include "hv.fullname" .)) .Values.coordinator.identity.signerSecret -}}
{{- range .Values.coordinator.fencing.bmcSecrets -}}
{{- if has . $own -}}
{{- fail (printf "coordinator.fencing.bmcSecrets names %s, a Secret of the chart's own key material: BMC credentials need Secrets of their own" .) -}}
{{- end -}}
{{- end -}}
{{- .Values.coordinator.fencing.bmcSecrets | uniq | toJson -}}
{{- end -}}

{{/* Metadata of the monitoring objects: the chart's labels, then monitoring.labels and
the object's own labels; annotations likewise. Arguments: the root context and the
object's values (monitoring.serviceMonitor or monitoring.prometheusRule). */}}
{{- define "hv.monitoringMetadata" -}}
{{- $root := index . 0 -}}
{{- $own := index . 1 -}}
{{- $m := $root.Values.monitoring -}}
labels:
  {{- toYaml (merge (include "hv.labels" $root | fromYaml) ($own.labels | default dict) ($m.labels | default dict)) | nindent 2 }}
{{- $annotations := merge (dict) ($own.annotations | default dict) ($m.annotations | default dict) }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* An alert's runbook: its heading in docs/operations.md (the GitHub anchor of
"### <Alert>" is the name lowercased). Arguments: the root context and the alert. */}}
{{- define "hv.runbook" -}}
{{- $base := required "monitoring.runbookBaseUrl is required with monitoring.prometheusRule.enabled: the URL of docs/operations.md where your SREs read it" (index . 0).Values.monitoring.runbookBaseUrl -}}
{{ $base }}#{{ lower (index . 1) }}
{{- end -}}
