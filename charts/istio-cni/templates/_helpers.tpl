{{/* Chart name, overridable. */}}
{{- define "istio-cni.name" -}}
{{- $cni := .Values.cni | default dict -}}
{{- .Values.nameOverride | default $cni.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of every resource of a release. */}}
{{- define "istio-cni.fullname" -}}
{{- $cni := .Values.cni | default dict -}}
{{- $override := .Values.fullnameOverride | default $cni.fullnameOverride -}}
{{- if $override -}}
{{- $override | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "istio-cni.name" . -}}
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

{{/* Istio's revision label on the resources (not the pods: a revision label can select pods for
injection). Takes the effective values. */}}
{{- define "istio-cni.revisionLabel" -}}
istio.io/rev: {{ .revision | default "default" | quote }}
{{- end -}}

{{/* Where the node's directories appear inside the agent container (config keys of the same name). */}}
{{- define "istio-cni.mountedCniBinDir" -}}/host/opt/cni/bin{{- end -}}
{{- define "istio-cni.mountedCniConfDir" -}}/host/etc/cni/net.d{{- end -}}
{{- define "istio-cni.hostProcDir" -}}/host/proc{{- end -}}
{{- define "istio-cni.mountedNetnsDir" -}}/host/var/run/netns{{- end -}}
{{- define "istio-cni.mountedCniCacheDir" -}}/host/var/lib/cni{{- end -}}
{{/* Where the image keeps the plugin built by ci/build-plugin (see Dockerfile). */}}
{{- define "istio-cni.pluginSourceDir" -}}/opt/istio-cni/bin{{- end -}}
{{- define "istio-cni.configDir" -}}/etc/istio-cni{{- end -}}

{{/* The agent's config.yaml: exactly the keys of agent/config.py Settings. */}}
{{- define "istio-cni.config" -}}
{{- $v := include "istio-cni.values" . | fromYaml -}}
{{- $repair := dict
  "enabled" $v.repair.enabled
  "mode" $v.repair.mode
  "labelKey" $v.repair.labelKey
  "labelValue" (toString $v.repair.labelValue)
  "initContainerName" $v.repair.initContainerName
  "initContainerExitCode" (int $v.repair.initContainerExitCode)
  "initContainerTerminationMessage" (toString $v.repair.initContainerTerminationMessage) -}}
{{- $a := $v.ambient -}}
{{- $ambient := dict
  "enabled" $a.enabled
  "enablementSelectors" ($a.enablementSelectors | default list)
  "dnsCapture" $a.dnsCapture
  "ipv6" $a.ipv6
  "reconcileIptablesOnStartup" $a.reconcileIptablesOnStartup
  "enableAmbientDetectionRetry" $a.enableAmbientDetectionRetry
  "failOpenOnDetectionError" $a.failOpenOnDetectionError
  "ztunnelSocketPath" $a.ztunnelSocketPath
  "systemNamespace" $a.systemNamespace
  "hostProbeSnatAddress" $a.hostProbeSnatAddress
  "hostProbeSnatAddressV6" $a.hostProbeSnatAddressV6 -}}
{{- $k := $v.kubeApi -}}
{{- $kubeApi := dict
  "lookupTimeoutSeconds" (int $k.lookupTimeoutSeconds)
  "updateTimeoutSeconds" (int $k.updateTimeoutSeconds)
  "listTimeoutSeconds" (int $k.listTimeoutSeconds)
  "nodeTimeoutSeconds" (int $k.nodeTimeoutSeconds)
  "stopTimeoutSeconds" (int $k.stopTimeoutSeconds)
  "readinessTimeoutSeconds" (int $k.readinessTimeoutSeconds)
  "qps" (int $k.qps)
  "burst" (int $k.burst) -}}
{{- $cfg := dict
  "cniBinDir" $v.cniBinDir
  "platform" ($v.platform | default "")
  "cniConfDir" $v.cniConfDir
  "cniConfFileName" $v.cniConfFileName
  "chained" $v.chained
  "istioOwnedCNIConfig" $v.istioOwnedCNIConfig
  "istioOwnedCNIConfigFileName" $v.istioOwnedCNIConfigFileName
  "logLevel" $v.logLevel
  "logAsJson" $v.logAsJson
  "excludeNamespaces" $v.excludeNamespaces
  "mountedCniBinDir" (include "istio-cni.mountedCniBinDir" .)
  "mountedCniConfDir" (include "istio-cni.mountedCniConfDir" .)
  "pluginSourceDir" (include "istio-cni.pluginSourceDir" .)
  "cniAgentRunDir" $v.cniAgentRunDir
  "hostProcDir" (include "istio-cni.hostProcDir" .)
  "mountedNetnsDir" (include "istio-cni.mountedNetnsDir" .)
  "mountedCniCacheDir" (include "istio-cni.mountedCniCacheDir" .)
  "cniNetnsDir" $v.cniNetnsDir
  "metricsPort" (int $v.metricsPort)
  "metricsAddress" $v.metricsAddress
  "ruleBackend" $v.ruleBackend
  "uninstallOnStop" $v.uninstallOnStop
  "conflictsPerMinuteWarning" (int $v.conflictsPerMinuteWarning)
  "cniConfGroupRead" $v.cniConfGroupRead
  "removeNotReadyTaint" $v.removeNotReadyTaint
  "daemonSetName" (include "istio-cni.fullname" .)
  "repair" $repair
  "ambient" $ambient
  "kubeApi" $kubeApi -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
Namespaces that get the NetworkAttachmentDefinition istio-cni (provider multus): the release
namespace, networkAttachmentNamespaces, and `default`, where Istio's chart creates it and Istio's
injector may point pods (default/istio-cni). A YAML list.
*/}}
{{- define "istio-cni.nadNamespaces" -}}
{{- concat (list .ctx.Release.Namespace) .v.networkAttachmentNamespaces (list "default") | uniq | toYaml -}}
{{- end -}}

{{/* For (list $ "podMonitor"): fails at template time unless the API server serves the Prometheus
operator's monitoring.coreos.com/v1 (its CRDs), instead of a release that fails at apply time. */}}
{{- define "istio-cni.requireMonitoringApi" -}}
{{- $ctx := index . 0 -}}
{{- if not ($ctx.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}
{{- fail (printf "values: %s.enabled is true but the cluster serves no monitoring.coreos.com/v1 (the Prometheus operator's CRDs, PodMonitor and PrometheusRule): install the operator's CRDs first, or set %s.enabled=false; with `helm template`, pass --api-versions monitoring.coreos.com/v1" (index . 1) (index . 1)) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the node restriction policy renders, for (dict "v" values "ctx" $): true, or auto
and the API server serves ValidatingAdmissionPolicy v1. */}}
{{- define "istio-cni.nodePolicyOn" -}}
{{- $on := .v.nodeRestrictionPolicy -}}
{{- if eq (toString $on) "auto" -}}
{{- $on = .ctx.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- end -}}
{{- if $on }}true{{ end -}}
{{- end -}}
