{{/*
"istio-cni.values": the effective values. Every template reads them, never .Values:

  {{- $v := include "istio-cni.values" . | fromYaml }}

values.yaml holds the defaults (copied to files/defaults.yaml, which templates can read); a value
equal to its default counts as not given. Layers, the later wins:
  1. the defaults
  2. global.* fallbacks (global.hub, global.logging.level, global.defaultResources, ...)
  3. Istio's profile / compatibilityVersion files (files/istio-profiles), then our platform preset
  4. the values given (those that differ from the defaults): our names, and Istio's spellings
     mapped onto them
Istio's `cni.X` means `X` (as Istio's zzy_descope_legacy.yaml). A setting given under two spellings
(ours and an Istio alias, or X and a different cni.X) fails naming both.
Keys starting with `_` are for templates only: _image, _pullSecrets, _env (extra container env),
_ignored (Istio keys with no effect here), _profile, _resourceScope, _presetSet (what the preset
or profile replaced), _istioImageIgnored (the image global.hub/global.tag named, when global.hub
is one of Istio's registries).
The result is computed once per render and kept in the top-level context (every template of one
chart shares it), as every template and several helpers ask for it.
*/}}
{{- define "istio-cni.values" -}}
{{- if and (hasKey . "Release") (hasKey . "Values") (hasKey . "_istioCniValues") -}}
{{- get . "_istioCniValues" -}}
{{- else -}}
{{- $text := include "istio-cni.resolve" . -}}
{{- if and (hasKey . "Release") (hasKey . "Values") }}{{ $_ := set . "_istioCniValues" $text }}{{ end -}}
{{- $text -}}
{{- end -}}
{{- end -}}

{{- define "istio-cni.resolve" -}}
{{- $defaults := .Files.Get "files/defaults.yaml" | fromYaml -}}
{{- $user := include "istio-cni.given" (dict "values" .Values "defaults" $defaults) | fromYaml -}}
{{- $_ := unset $user "enabled" -}}
{{- include "istio-cni.descope" (dict "values" $user "strict" true) -}}
{{- $global := $user.global | default dict -}}
{{- $_ := unset $user "global" -}}
{{- $out := deepCopy $defaults -}}
{{- $_ := unset $out "global" -}}
{{- /* 2. global.* fallbacks */ -}}
{{- include "istio-cni.overlay" (list $out (include "istio-cni.fromGlobal" $global | fromYaml)) -}}
{{- /* 3. Istio profile files (profile < compatibilityVersion, as Istio), then our preset */ -}}
{{- $profileName := $user.profile | default $global.profile | default "" -}}
{{- $files := list -}}
{{- with $profileName -}}
{{- $files = append $files (dict "file" (printf "profile-%s.yaml" .) "what" "profile" "name" .) -}}
{{- end -}}
{{- with $user.compatibilityVersion -}}
{{- $files = append $files (dict "file" (printf "profile-compatibility-version-%v.yaml" .) "what" "compatibility version" "name" (toString .)) -}}
{{- end -}}
{{- range $files -}}
{{- $text := $.Files.Get (printf "files/istio-profiles/%s" .file) -}}
{{- if not $text -}}
{{- fail (printf "values: unknown %s %q: see charts/istio-cni/files/istio-profiles for the ones Istio ships" .what .name) -}}
{{- end -}}
{{- $profile := $text | fromYaml -}}
{{- include "istio-cni.descope" (dict "values" $profile "strict" false) -}}
{{- /* A profile's global.* names images and proxies of other charts (ambient's distroless
    variant is a tag we do not publish): ignored. */ -}}
{{- $_ := unset $profile "global" -}}
{{- $mapped := include "istio-cni.fromIstio" (dict "values" $profile "defaults" $defaults) | fromYaml -}}
{{- $_ := unset $mapped "_ignored" -}}
{{- include "istio-cni.overlay" (list $out $mapped) -}}
{{- end -}}
{{- $platform := $user.platform | default $global.platform | default "" -}}
{{- if $platform -}}
{{- $presets := include "istio-cni.presets" . | fromYaml -}}
{{- if not (hasKey $presets $platform) -}}
{{- fail (printf "values: unknown platform %q: one of %s" $platform (keys $presets | sortAlpha | join ", ")) -}}
{{- end -}}
{{- include "istio-cni.overlay" (list $out (get $presets $platform)) -}}
{{- end -}}
{{- /* 4. the values you set */ -}}
{{- $mine := include "istio-cni.fromIstio" (dict "values" $user "defaults" $defaults) | fromYaml -}}
{{- /* What the preset replaced of values still at their default (NOTES and the ConfigMap say
    it: a value given equal to its default is replaced too, as the chart cannot tell it). */ -}}
{{- $presetSet := list -}}
{{- if $platform -}}
{{- range $key, $value := get (include "istio-cni.presets" . | fromYaml) $platform -}}
{{- if kindIs "map" $value -}}
{{- range $sub, $subValue := $value -}}
{{- $default := index (index $defaults $key | default dict) $sub -}}
{{- if and (ne (toJson $subValue) (toJson $default)) (not (hasKey (index $mine $key | default dict) $sub)) -}}
{{- $presetSet = append $presetSet (printf "%s.%s: %s (default %s)" $key $sub (toJson $subValue) (toJson $default)) -}}
{{- end -}}
{{- end -}}
{{- else if and (ne (toJson $value) (toJson (index $defaults $key))) (not (hasKey $mine $key)) -}}
{{- $presetSet = append $presetSet (printf "%s: %s (default %s)" $key (toJson $value) (toJson (index $defaults $key))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ignored := $mine._ignored | default list -}}
{{- if not (kindIs "invalid" $global.networkPolicy) }}{{ $ignored = append $ignored "global.networkPolicy" }}{{ end -}}
{{- $_ := unset $mine "_ignored" -}}
{{- include "istio-cni.overlay" (list $out $mine) -}}
{{- $_ := set $out "platform" $platform -}}
{{- /* Derived values */ -}}
{{- range $key := list "networkAttachmentNamespaces" "excludeNamespaces" "imagePullSecrets" "tolerations" -}}
{{- $_ := set $out $key (get $out $key | default list) -}}
{{- end -}}
{{- if not $out.istioOwnedCNIConfigFileName -}}
{{- $_ := set $out "istioOwnedCNIConfigFileName" "02-istio-cni.conflist" -}}
{{- end -}}
{{- if eq (toString $out.provider) "default" -}}
{{- $_ := set $out "provider" "" -}}
{{- end -}}
{{- /* Istio's GKE detection: no bin dir set anywhere and the API server is GKE's. */ -}}
{{- if and (not $platform) (not (hasKey $mine "cniBinDir")) (contains "-gke" .Capabilities.KubeVersion.GitVersion) -}}
{{- $_ := set $out "cniBinDir" "/home/kubernetes/bin" -}}
{{- end -}}
{{- /* A hub of Istio's registries given as ours (an Istio values file's hub or cni.hub) names an
    image Istio never publishes: refused, as the global.* fallback is ignored with a warning. */ -}}
{{- if and (hasKey $mine "hub") (has (trimSuffix "/" (toString $mine.hub)) (include "istio-cni.istioRegistries" . | fromYamlArray)) (not (contains "/" (toString ($out.image | default "")))) -}}
{{- fail (printf "values: hub %s is one of Istio's registries, which never publish this agent (%s/istio-cni:%s does not exist there): leave hub out (default %s), or set it to the registry that mirrors %s/istio-cni" (toString $mine.hub) (trimSuffix "/" (toString $mine.hub)) (toString ($out.tag | default .Chart.AppVersion)) $defaults.hub $defaults.hub) -}}
{{- end -}}
{{- /* Your own hub, tag or full image reference decides; the warning is only for a fallback. */ -}}
{{- if or (hasKey $mine "hub") (hasKey $mine "tag") (contains "/" (toString ($out.image | default ""))) -}}
{{- $_ := unset $out "_istioImageIgnored" -}}
{{- end -}}
{{- $_ := set $out "_image" (include "istio-cni.imageRef" (dict "v" $out "ctx" $)) -}}
{{- $secrets := list -}}
{{- range concat $out.imagePullSecrets ($global.imagePullSecrets | default list) -}}
{{- if kindIs "map" . }}{{ $secrets = append $secrets .name }}{{ else }}{{ $secrets = append $secrets . }}{{ end -}}
{{- end -}}
{{- $_ := set $out "_pullSecrets" ($secrets | uniq) -}}
{{- $env := list -}}
{{- range $name, $value := $out.env | default dict -}}
{{- $env = append $env (dict "name" $name "value" (kindIs "invalid" $value | ternary "" (toString $value))) -}}
{{- end -}}
{{- $_ := set $out "_env" $env -}}
{{- $_ := set $out "_ignored" $ignored -}}
{{- $_ := set $out "_profile" $profileName -}}
{{- $_ := set $out "_presetSet" $presetSet -}}
{{- $_ := set $out "_resourceScope" ($global.resourceScope | default "all") -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The values given, for (dict "values" .Values "defaults" D): .Values (Helm's merge of the values
given over values.yaml) without the values equal to their default, so that "given" means "differs
from the default". The groups (repair, ambient, ...) are compared key by key; any other value
(a map such as resources, a list such as tolerations) as a whole. Keys values.yaml does not have
(Istio's spellings) are given whenever present.
*/}}
{{- define "istio-cni.given" -}}
{{- $defaults := .defaults -}}
{{- $out := dict -}}
{{- range $key, $value := .values -}}
{{- if not (hasKey $defaults $key) -}}
{{- $_ := set $out $key $value -}}
{{- else if and (has $key (list "repair" "ambient" "kubeApi" "resourceQuota" "podMonitor" "prometheusRule" "dashboards" "global")) (kindIs "map" $value) -}}
{{- $group := dict -}}
{{- $groupDefaults := index $defaults $key -}}
{{- range $sub, $subValue := $value -}}
{{- if or (not (hasKey $groupDefaults $sub)) (ne (toJson $subValue) (toJson (index $groupDefaults $sub))) -}}
{{- $_ := set $group $sub $subValue -}}
{{- end -}}
{{- end -}}
{{- if $group }}{{ $_ := set $out $key $group }}{{ end -}}
{{- else if ne (toJson $value) (toJson (index $defaults $key)) -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- /* A map or list given as null is gone from .Values (Helm's merge deletes it): none, as in
    any chart (`seccompProfile: null`, `tolerations: null`). A null scalar or group means its
    default. */ -}}
{{- range $key, $default := $defaults -}}
{{- if and (not (hasKey $.values $key)) (not (has $key (list "repair" "ambient" "kubeApi" "resourceQuota" "podMonitor" "prometheusRule" "dashboards" "global"))) -}}
{{- if kindIs "map" $default }}{{ $_ := set $out $key dict }}{{ end -}}
{{- if kindIs "slice" $default }}{{ $_ := set $out $key list }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Whether a resource of scope "cluster" or "namespace" renders (Istio's global.resourceScope). */}}
{{- define "istio-cni.inScope" -}}
{{- $scope := (index . 0)._resourceScope -}}
{{- if or (eq $scope "all") (eq $scope (index . 1)) }}true{{ end -}}
{{- end -}}

{{/* The agent image: `image` with a `/` is a full reference, else <hub>/<image>:<tag>[-<variant>];
`digest` pins it (`...@sha256:...`, the tag kept for people reading it). */}}
{{- define "istio-cni.imageRef" -}}
{{- $v := .v -}}
{{- $image := toString ($v.image | default "istio-cni") -}}
{{- $ref := $image -}}
{{- if not (contains "/" $image) -}}
{{- $tag := toString ($v.tag | default .ctx.Chart.AppVersion) -}}
{{- with $v.variant }}{{ $tag = printf "%s-%s" $tag . }}{{ end -}}
{{- $ref = printf "%s/%s:%s" (trimSuffix "/" (toString $v.hub)) $image $tag -}}
{{- end -}}
{{- if and $v.digest (not (contains "@" $ref)) -}}
{{- $ref = printf "%s@%s" $ref $v.digest -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/*
Deep merge of (list dst src [nested]) into dst: a non-empty src map merges into a dst map; other
src values (lists, scalars, `{}`) replace. A null src value keeps dst's at the top level (values.yaml
leaves every value null) and removes dst's inside a map, as a null does in Helm's own merge.
*/}}
{{- define "istio-cni.overlay" -}}
{{- $dst := index . 0 -}}
{{- $nested := gt (len .) 2 -}}
{{- range $key, $value := index . 1 -}}
{{- $old := index $dst $key -}}
{{- if kindIs "invalid" $value -}}
{{- if $nested }}{{ $_ := unset $dst $key }}{{ end -}}
{{- else if and (kindIs "map" $value) (kindIs "map" $old) $value -}}
{{- include "istio-cni.overlay" (list $old $value true) -}}
{{- else -}}
{{- $_ := set $dst $key (deepCopy $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Istio's `cni.X` means `X`: moves .values.cni over the top level. strict (your values): X and cni.X
set to different values fail naming both; otherwise (Istio's profile files) cni.X wins, as in Istio.
*/}}
{{- define "istio-cni.descope" -}}
{{- $cni := index .values "cni" -}}
{{- $_ := unset .values "cni" -}}
{{- if kindIs "map" $cni -}}
{{- include "istio-cni.descopeInto" (dict "dst" .values "src" $cni "path" "" "strict" .strict) -}}
{{- end -}}
{{- end -}}

{{- define "istio-cni.descopeInto" -}}
{{- $dst := .dst -}}
{{- $strict := .strict -}}
{{- $path := .path -}}
{{- range $key, $value := .src -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $old := index $dst $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $old) -}}
{{- include "istio-cni.descopeInto" (dict "dst" $old "src" $value "path" (printf "%s%s." $path $key) "strict" $strict) -}}
{{- else -}}
{{- if and $strict (not (kindIs "invalid" $old)) (ne (toJson $old) (toJson $value)) -}}
{{- fail (printf "values: %s%s and cni.%s%s are both given (%s and %s): cni.X is Istio's spelling of X; give it once (in your values files and --set)" $path $key $path $key (toJson $old) (toJson $value)) -}}
{{- end -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Istio's global.* keys that are fallbacks for ours (used when ours is not set anywhere). */}}
{{- define "istio-cni.fromGlobal" -}}
{{- $g := . -}}
{{- $out := dict -}}
{{- range $ours, $theirs := dict "hub" "hub" "tag" "tag" "variant" "variant" "pullPolicy" "imagePullPolicy" "logAsJson" "logAsJson" "resources" "defaultResources" -}}
{{- $value := index $g $theirs -}}
{{- if and (not (kindIs "invalid" $value)) (ne (toString $value) "") -}}
{{- $_ := set $out $ours $value -}}
{{- end -}}
{{- end -}}
{{- with ($g.logging | default dict).level }}{{ $_ := set $out "logLevel" . }}{{ end -}}
{{- if $g.nativeNftables }}{{ $_ := set $out "ruleBackend" "nftables" }}{{ end -}}
{{- /* Istio's own registries never hold this agent (an Istio values file sets global.hub to
    one and global.tag to Istio's version): the image stays ours, and NOTES says why. */ -}}
{{- $hub := trimSuffix "/" (toString ($out.hub | default "")) -}}
{{- if has $hub (include "istio-cni.istioRegistries" . | fromYamlArray) -}}
{{- $_ := set $out "_istioImageIgnored" (printf "%s/istio-cni:%s" $hub (toString ($out.tag | default ""))) -}}
{{- $_ := unset $out "hub" -}}
{{- $_ := unset $out "tag" -}}
{{- $_ := unset $out "variant" -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Registries that publish Istio's images (global.hub of Istio's releases, its builds and its
docs), never this agent's. */}}
{{- define "istio-cni.istioRegistries" -}}
{{- list "docker.io/istio" "index.docker.io/istio" "istio" "gcr.io/istio-release" "gcr.io/istio-testing" "registry.istio.io/release" "registry.istio.io/testing" "mirror.gcr.io/istio" | toYaml -}}
{{- end -}}

{{/*
Istio's spellings mapped onto ours, for (dict "values" V "ctx" $) with V already descoped and
without `global`. Returns YAML: the values set (ours, plus Istio's image keys variant,
daemonSetLabels, revision, env) and `_ignored` (key paths with no effect here).
Order of precedence inside one layer does not exist: two spellings of one setting fail.
*/}}
{{- define "istio-cni.fromIstio" -}}
{{- $v := .values -}}
{{- $defaults := .defaults -}}
{{- $st := dict "out" dict "from" dict -}}
{{- $ignored := list -}}
{{- /* Istio writes "" for "not set" here (hub, tag, pullPolicy, image ...). */ -}}
{{- $emptyIsUnset := list "hub" "tag" "digest" "pullPolicy" "image" "istioOwnedCNIConfigFileName" "cniBinDir" "cniConfDir" "cniNetnsDir" -}}
{{- /* Our names; Istio's chart uses the same ones for most settings. */ -}}
{{- range $key, $default := $defaults -}}
{{- if has $key (list "global" "platform") }}{{ continue }}{{ end -}}
{{- if has $key (list "repair" "resourceQuota" "ambient" "kubeApi" "podMonitor" "prometheusRule" "dashboards") -}}
{{- $given := index $v $key | default dict -}}
{{- range $sub, $_ := $default -}}
{{- $value := index $given $sub -}}
{{- if not (kindIs "invalid" $value) -}}
{{- include "istio-cni.put" (dict "st" $st "key" (printf "%s.%s" $key $sub) "value" $value "from" (printf "%s.%s" $key $sub)) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $value := index $v $key -}}
{{- if and (not (kindIs "invalid" $value)) (not (and (has $key $emptyIsUnset) (eq (toString $value) ""))) -}}
{{- if and (eq $key "provider") (eq (toString $value) "default") }}{{ $value = "" }}{{ end -}}
{{- include "istio-cni.put" (dict "st" $st "key" $key "value" $value "from" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Istio-only keys that act here as they do in Istio's chart. */ -}}
{{- range $key := list "image" "variant" "daemonSetLabels" "revision" "env" -}}
{{- $value := index $v $key -}}
{{- if and (not (kindIs "invalid" $value)) (ne (toString $value) "") -}}
{{- $_ := set $st.out $key $value -}}
{{- end -}}
{{- end -}}
{{- with ($v.logging | default dict).level -}}
{{- include "istio-cni.put" (dict "st" $st "key" "logLevel" "value" . "from" "logging.level") -}}
{{- end -}}
{{- $quotas := $v.resourceQuotas | default dict -}}
{{- range $sub := list "enabled" "pods" -}}
{{- $value := index $quotas $sub -}}
{{- if not (kindIs "invalid" $value) -}}
{{- include "istio-cni.put" (dict "st" $st "key" (printf "resourceQuota.%s" $sub) "value" $value "from" (printf "resourceQuotas.%s" $sub)) -}}
{{- end -}}
{{- end -}}
{{- $repair := $v.repair | default dict -}}
{{- range $theirs, $ours := dict "brokenPodLabelKey" "labelKey" "brokenPodLabelValue" "labelValue" -}}
{{- $value := index $repair $theirs -}}
{{- if not (kindIs "invalid" $value) -}}
{{- include "istio-cni.put" (dict "st" $st "key" (printf "repair.%s" $ours) "value" $value "from" (printf "repair.%s" $theirs)) -}}
{{- end -}}
{{- end -}}
{{- range $key := list "hub" "tag" -}}
{{- if not (kindIs "invalid" (index $repair $key)) }}{{ $ignored = append $ignored (printf "repair.%s" $key) }}{{ end -}}
{{- end -}}
{{- /* Keys of Istio's chart (and its profile files) that have no effect here. */ -}}
{{- range $key := list "pilot" "trustedZtunnelNamespace" "meshConfig" "istiodRemote" "telemetry" "experimental" "useAppArmorAnnotation" "ownerName" "configMap" "ztunnel" "gateways" -}}
{{- if not (kindIs "invalid" (index $v $key)) }}{{ $ignored = append $ignored $key }}{{ end -}}
{{- end -}}
{{- /* ambient: configDir is read by no agent; this agent always shares the host's network
    namespace, so only an explicit shareHostNetworkNamespace false goes unhonoured. */ -}}
{{- $ambientValues := $v.ambient | default dict -}}
{{- if not (kindIs "invalid" $ambientValues.configDir) }}{{ $ignored = append $ignored "ambient.configDir" }}{{ end -}}
{{- if and (kindIs "bool" $ambientValues.shareHostNetworkNamespace) (not $ambientValues.shareHostNetworkNamespace) -}}
{{- $ignored = append $ignored "ambient.shareHostNetworkNamespace" -}}
{{- end -}}
{{- /* Istio's repair flags, from repair.* or env REPAIR_*; Istio's precedence repairPods >
    deletePods > labelPods, an unset repairPods counting as Istio's default true. */ -}}
{{- $env := $v.env | default dict -}}
{{- $flags := dict -}}
{{- $flagsFrom := list -}}
{{- range $flag, $envName := dict "repairPods" "REPAIR_REPAIR_PODS" "deletePods" "REPAIR_DELETE_PODS" "labelPods" "REPAIR_LABEL_PODS" -}}
{{- $value := index $repair $flag -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $_ := set $flags $flag $value -}}
{{- $flagsFrom = append $flagsFrom (printf "repair.%s" $flag) -}}
{{- end -}}
{{- $rawValue := index $env $envName -}}
{{- $raw := kindIs "invalid" $rawValue | ternary "" (toString $rawValue) -}}
{{- if $raw -}}
{{- if hasKey $flags $flag -}}
{{- fail (printf "values: repair.%s and env.%s are both given: they are one setting; give only one (in your values files and --set)" $flag $envName) -}}
{{- end -}}
{{- $_ := set $flags $flag (eq (include "istio-cni.parseBool" (dict "name" (printf "env.%s" $envName) "value" $raw)) "true") -}}
{{- $flagsFrom = append $flagsFrom (printf "env.%s" $envName) -}}
{{- end -}}
{{- end -}}
{{- $noRepair := false -}}
{{- if $flags -}}
{{- $mode := "" -}}
{{- if or (not (hasKey $flags "repairPods")) $flags.repairPods }}{{ $mode = "repair-in-place" -}}
{{- else if $flags.deletePods }}{{ $mode = "delete" -}}
{{- else if $flags.labelPods }}{{ $mode = "label" -}}
{{- end -}}
{{- if $mode -}}
{{- include "istio-cni.put" (dict "st" $st "key" "repair.mode" "value" $mode "from" ($flagsFrom | sortAlpha | join "/")) -}}
{{- else -}}
{{- $noRepair = true -}}
{{- end -}}
{{- end -}}
{{- /* Environment variables Istio's agent reads: those with a meaning here set it. */ -}}
{{- $envKeys := dict "CNI_CONF_NAME" "cniConfFileName:string" "CHAINED_CNI_PLUGIN" "chained:bool" "ISTIO_OWNED_CNI_CONFIG" "istioOwnedCNIConfig:bool" "ISTIO_OWNED_CNI_CONFIG_FILENAME" "istioOwnedCNIConfigFileName:string" "EXCLUDE_NAMESPACES" "excludeNamespaces:list" "CNI_CONF_GROUP_READ" "cniConfGroupRead:bool" "MONITORING_PORT" "metricsPort:port" "CNI_AGENT_RUN_DIR" "cniAgentRunDir:path" "REPAIR_ENABLED" "repair.enabled:bool" "REPAIR_BROKEN_POD_LABEL_KEY" "repair.labelKey:string" "REPAIR_BROKEN_POD_LABEL_VALUE" "repair.labelValue:string" "REPAIR_INIT_CONTAINER_NAME" "repair.initContainerName:string" "REPAIR_INIT_CONTAINER_EXIT_CODE" "repair.initContainerExitCode:exitcode" "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE" "repair.initContainerTerminationMessage:string" "AMBIENT_ENABLED" "ambient.enabled:bool" "AMBIENT_DNS_CAPTURE" "ambient.dnsCapture:bool" "AMBIENT_IPV6" "ambient.ipv6:bool" "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP" "ambient.reconcileIptablesOnStartup:bool" "ENABLE_AMBIENT_DETECTION_RETRY" "ambient.enableAmbientDetectionRetry:bool" "ZTUNNEL_UDS_ADDRESS" "ambient.ztunnelSocketPath:path" "SYSTEM_NAMESPACE" "ambient.systemNamespace:namespace" "HOST_PROBE_SNAT_IP" "ambient.hostProbeSnatAddress:ipv4" "HOST_PROBE_SNAT_IPV6" "ambient.hostProbeSnatAddressV6:ipv6" -}}
{{- $backend := "" -}}
{{- range $name, $rawValue := $env -}}
{{- $raw := kindIs "invalid" $rawValue | ternary "" (toString $rawValue) -}}
{{- $where := printf "env.%s" $name -}}
{{- if hasKey $envKeys $name -}}
{{- $spec := splitList ":" (get $envKeys $name) -}}
{{- $key := first $spec -}}
{{- $kind := last $spec -}}
{{- $value := $raw -}}
{{- if eq $kind "bool" -}}
{{- $value = eq (include "istio-cni.parseBool" (dict "name" $where "value" $raw)) "true" -}}
{{- else if eq $kind "port" -}}
{{- if or (not (regexMatch "^[0-9]{1,5}$" $raw)) (lt (atoi $raw) 1) (gt (atoi $raw) 65535) -}}
{{- fail (printf "values: %s: %q is not a port number (1-65535)" $where $raw) -}}
{{- end -}}
{{- $value = atoi $raw -}}
{{- else if eq $kind "exitcode" -}}
{{- if or (not (regexMatch "^[0-9]{1,3}$" $raw)) (gt (atoi $raw) 255) -}}
{{- fail (printf "values: %s: %q is not an exit code (0-255)" $where $raw) -}}
{{- end -}}
{{- $value = atoi $raw -}}
{{- else if eq $kind "path" -}}
{{- if not (hasPrefix "/" $raw) }}{{ fail (printf "values: %s: %q is not an absolute path" $where $raw) }}{{ end -}}
{{- else if eq $kind "namespace" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" $raw) }}{{ fail (printf "values: %s: %q is not a namespace name" $where $raw) }}{{ end -}}
{{- else if eq $kind "ipv4" -}}
{{- if not (regexMatch "^((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])[.]){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])$" $raw) }}{{ fail (printf "values: %s: %q is not an IPv4 address" $where $raw) }}{{ end -}}
{{- else if eq $kind "ipv6" -}}
{{- /* A rough check; the agent parses it exactly at start, naming the key. */ -}}
{{- if not (and (contains ":" $raw) (regexMatch "^[0-9A-Fa-f:.]+$" $raw)) }}{{ fail (printf "values: %s: %q is not an IPv6 address" $where $raw) }}{{ end -}}
{{- else if eq $kind "list" -}}
{{- $items := list -}}
{{- range splitList "," $raw }}{{ with trim . }}{{ $items = append $items . }}{{ end }}{{ end -}}
{{- $value = $items -}}
{{- end -}}
{{- if or (ne $raw "") (eq $kind "string") -}}
{{- include "istio-cni.put" (dict "st" $st "key" $key "value" $value "from" $where) -}}
{{- end -}}
{{- else if eq $name "NATIVE_NFTABLES" -}}
{{- if and $raw (eq (include "istio-cni.parseBool" (dict "name" $where "value" $raw)) "true") }}{{ $backend = "nftables" }}{{ end -}}
{{- else if eq $name "FORCE_IPTABLES_BINARY" -}}
{{- if not (has $raw (list "" "legacy" "nft")) -}}
{{- fail (printf "values: %s: %q is not one of legacy, nft (or empty)" $where $raw) -}}
{{- end -}}
{{- if and $raw (ne $backend "nftables") }}{{ $backend = printf "iptables-%s" $raw }}{{ end -}}
{{- else if eq $name "AMBIENT_ENABLEMENT_SELECTOR" -}}
{{- if $raw -}}
{{- include "istio-cni.put" (dict "st" $st "key" "ambient.enablementSelectors" "value" (include "istio-cni.parseSelectors" (dict "name" $where "value" $raw) | fromYamlArray) "from" $where) -}}
{{- end -}}
{{- else if not (has $name (list "REPAIR_REPAIR_PODS" "REPAIR_DELETE_PODS" "REPAIR_LABEL_PODS")) -}}
{{- $ignored = append $ignored $where -}}
{{- end -}}
{{- end -}}
{{- with $backend -}}
{{- include "istio-cni.put" (dict "st" $st "key" "ruleBackend" "value" . "from" (eq . "nftables" | ternary "env.NATIVE_NFTABLES" "env.FORCE_IPTABLES_BINARY")) -}}
{{- end -}}
{{- /* All three repair flags false: Istio's controller takes no action, so repair is off. */ -}}
{{- if $noRepair }}{{ $_ := set $st.out "repair.enabled" false }}{{ end -}}
{{- $result := dict "_ignored" $ignored -}}
{{- range $key, $value := $st.out -}}
{{- $parts := splitList "." $key -}}
{{- if eq (len $parts) 2 -}}
{{- $inner := index $result (first $parts) | default dict -}}
{{- $_ := set $inner (last $parts) $value -}}
{{- $_ := set $result (first $parts) $inner -}}
{{- else -}}
{{- $_ := set $result $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $result -}}
{{- end -}}

{{/* Records one setting in (dict "st" "key" "value" "from"); a second spelling of it fails. */}}
{{- define "istio-cni.put" -}}
{{- with get .st.from .key -}}
{{- fail (printf "values: %s and %s are both given: they are one setting (%s here); give only one (in your values files and --set)" . $.from $.key) -}}
{{- end -}}
{{- $_ := set .st.out .key .value -}}
{{- $_ := set .st.from .key .from -}}
{{- end -}}

{{/*
Istio's AMBIENT_ENABLEMENT_SELECTOR (YAML text of a list of {podSelector, namespaceSelector}) for
(dict "name" "value"): the list as YAML, or fails naming the variable. The agent validates the
label selectors inside at start, naming the key.
*/}}
{{- define "istio-cni.parseSelectors" -}}
{{- $list := .value | fromYamlArray -}}
{{- range $list -}}
{{- if not (kindIs "map" .) -}}
{{- fail (printf "values: %s: not a YAML list of {podSelector, namespaceSelector} (%s)" $.name (toString .)) -}}
{{- end -}}
{{- range $key, $_ := . -}}
{{- if not (has $key (list "podSelector" "namespaceSelector")) -}}
{{- fail (printf "values: %s: unknown key %q in an entry (known: podSelector, namespaceSelector)" $.name $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $list -}}
{{- end -}}

{{/* Go's strconv.ParseBool, as Istio's agent reads its environment: "true"/"false" or fails. */}}
{{- define "istio-cni.parseBool" -}}
{{- if has .value (list "1" "t" "T" "TRUE" "true" "True") }}true
{{- else if has .value (list "0" "f" "F" "FALSE" "false" "False") }}false
{{- else }}{{ fail (printf "values: %s: %q is not a boolean (true or false)" .name .value) }}
{{- end -}}
{{- end -}}
