{{/*
Built-in platform presets, selected with `platform` (or Istio's global.platform): each names the
CNI paths checked for that platform and what else differs from the built-in defaults
(files/defaults.yaml). values-examples/<platform>.yaml spells out the same values with the reason
and the source they were checked against; tests/chart checks that both render the same.
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
