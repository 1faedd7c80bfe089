{{/*
Built-in platform presets, selected with `platform`: each names the CNI paths checked for that
platform and what else differs from "istio-cni.defaults". values-examples/<platform>.yaml spells out
the same values with the reason and the source they were checked against; tests/chart checks that
both render the same.
*/}}
{{- define "istio-cni.presets" -}}
gke:
  cniBinDir: /home/kubernetes/bin
  resourceQuota:
    enabled: true
openshift:
  cniBinDir: /var/lib/cni/bin
  cniConfDir: /etc/cni/multus/net.d
  cniConfFileName: istio-cni.conf
  chained: false
  provider: multus
  psp_cluster_role: "system:openshift:scc:privileged"
  seLinuxOptions:
    type: spc_t
eks:
  cniBinDir: /opt/cni/bin
  cniConfDir: /etc/cni/net.d
aks:
  cniBinDir: /opt/cni/bin
  cniConfDir: /etc/cni/net.d
iks:
  cniBinDir: /opt/cni/bin
  cniConfDir: /etc/cni/net.d
k3s:
  cniBinDir: /var/lib/rancher/k3s/data/cni
  cniConfDir: /var/lib/rancher/k3s/agent/etc/cni/net.d
k3d:
  cniBinDir: /bin
  cniConfDir: /var/lib/rancher/k3s/agent/etc/cni/net.d
microk8s:
  cniBinDir: /var/snap/microk8s/current/opt/cni/bin
  cniConfDir: /var/snap/microk8s/current/args/cni-network
minikube:
  cniNetnsDir: /var/run/docker/netns
kind:
  cniBinDir: /opt/cni/bin
  cniConfDir: /etc/cni/net.d
rke2:
  cniBinDir: /opt/cni/bin
  cniConfDir: /etc/cni/net.d
  seLinuxOptions:
    type: spc_t
{{- end -}}

{{/* What a value means when neither the user nor the preset sets it (agent/config.py defaults). */}}
{{- define "istio-cni.defaults" -}}
cniBinDir: /opt/cni/bin
cniConfDir: /etc/cni/net.d
cniConfFileName: ""
chained: true
cniNetnsDir: /var/run/netns
provider: ""
psp_cluster_role: ""
seLinuxOptions: {}
resourceQuota:
  enabled: false
{{- end -}}

{{/*
The preset-able values, resolved: the user's value when set (not null), else the preset's, else
the default. Returns YAML; use as `include "istio-cni.resolved" . | fromYaml`.
*/}}
{{- define "istio-cni.resolved" -}}
{{- $presets := include "istio-cni.presets" . | fromYaml -}}
{{- $preset := dict -}}
{{- if .Values.platform -}}
{{- $preset = get $presets .Values.platform | default dict -}}
{{- end -}}
{{- $defaults := include "istio-cni.defaults" . | fromYaml -}}
{{- $out := dict -}}
{{- range $key := list "cniBinDir" "cniConfDir" "cniConfFileName" "chained" "cniNetnsDir" "provider" "psp_cluster_role" "seLinuxOptions" -}}
{{- $user := index $.Values $key -}}
{{- if not (kindIs "invalid" $user) -}}
{{- $_ := set $out $key $user -}}
{{- else if hasKey $preset $key -}}
{{- $_ := set $out $key (get $preset $key) -}}
{{- else -}}
{{- $_ := set $out $key (get $defaults $key) -}}
{{- end -}}
{{- end -}}
{{- $userQuota := index (.Values.resourceQuota | default dict) "enabled" -}}
{{- if not (kindIs "invalid" $userQuota) -}}
{{- $_ := set $out "resourceQuotaEnabled" $userQuota -}}
{{- else if hasKey $preset "resourceQuota" -}}
{{- $_ := set $out "resourceQuotaEnabled" $preset.resourceQuota.enabled -}}
{{- else -}}
{{- $_ := set $out "resourceQuotaEnabled" $defaults.resourceQuota.enabled -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
