{{/* Chart name, overridable. */}}
{{- define "istio-cni.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of every resource of a release. */}}
{{- define "istio-cni.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the agent pods; never change them (a DaemonSet selector is immutable). */}}
{{- define "istio-cni.selectorLabels" -}}
app.kubernetes.io/name: {{ include "istio-cni.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Standard labels of every resource. */}}
{{- define "istio-cni.labels" -}}
{{ include "istio-cni.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: cni-node-agent
app.kubernetes.io/part-of: istio
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The agent image: hub and tag fall back to global.hub / global.tag, then built-in defaults. */}}
{{- define "istio-cni.image" -}}
{{- $global := .Values.global | default dict -}}
{{- $hub := .Values.hub | default $global.hub | default "ghcr.io/istio-cni" -}}
{{- $tag := .Values.tag | default $global.tag | default .Chart.AppVersion -}}
{{- printf "%s/istio-cni:%s" (trimSuffix "/" $hub) (toString $tag) -}}
{{- end -}}

{{/* Where the node's directories appear inside the agent container (config keys of the same name). */}}
{{- define "istio-cni.mountedCniBinDir" -}}/host/opt/cni/bin{{- end -}}
{{- define "istio-cni.mountedCniConfDir" -}}/host/etc/cni/net.d{{- end -}}
{{- define "istio-cni.hostProcDir" -}}/host/proc{{- end -}}
{{- define "istio-cni.mountedNetnsDir" -}}/host/var/run/netns{{- end -}}
{{/* Where the image keeps the plugin built by ci/build-plugin (see Dockerfile). */}}
{{- define "istio-cni.pluginSourceDir" -}}/opt/istio-cni/bin{{- end -}}
{{- define "istio-cni.configDir" -}}/etc/istio-cni{{- end -}}

{{/* The agent's config.yaml: exactly the keys of agent/config.py Settings. */}}
{{- define "istio-cni.config" -}}
{{- $s := include "istio-cni.resolved" . | fromYaml -}}
{{- $repair := dict
  "enabled" .Values.repair.enabled
  "mode" .Values.repair.mode
  "labelKey" .Values.repair.labelKey
  "labelValue" (toString .Values.repair.labelValue)
  "initContainerName" .Values.repair.initContainerName -}}
{{- $cfg := dict
  "cniBinDir" $s.cniBinDir
  "cniConfDir" $s.cniConfDir
  "cniConfFileName" $s.cniConfFileName
  "chained" $s.chained
  "istioOwnedCNIConfig" .Values.istioOwnedCNIConfig
  "istioOwnedCNIConfigFileName" .Values.istioOwnedCNIConfigFileName
  "logLevel" .Values.logLevel
  "excludeNamespaces" (.Values.excludeNamespaces | default list)
  "mountedCniBinDir" (include "istio-cni.mountedCniBinDir" .)
  "mountedCniConfDir" (include "istio-cni.mountedCniConfDir" .)
  "pluginSourceDir" (include "istio-cni.pluginSourceDir" .)
  "cniAgentRunDir" .Values.cniAgentRunDir
  "hostProcDir" (include "istio-cni.hostProcDir" .)
  "mountedNetnsDir" (include "istio-cni.mountedNetnsDir" .)
  "metricsPort" (int .Values.metricsPort)
  "metricsAddress" (.Values.metricsAddress | default "")
  "ruleBackend" .Values.ruleBackend
  "uninstallOnStop" .Values.uninstallOnStop
  "conflictsPerMinuteWarning" (int .Values.conflictsPerMinuteWarning)
  "repair" $repair -}}
{{- toYaml $cfg -}}
{{- end -}}
