{{/* Names: "<release>-<chart>" unless overridden, cut to the 63 characters a label allows. */}}
{{- define "duplex-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "duplex-gateway.fullname" -}}
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

{{/* "<fullname>-<component>", e.g. "demo-duplex-gateway-gateway". */}}
{{- define "duplex-gateway.componentName" -}}
{{- printf "%s-%s" (include "duplex-gateway.fullname" .root | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "duplex-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: duplex-gateway
{{- end -}}

{{/* The labels that select one component's pods: {root, component}, and {pool} for one
worker pool's (without it they select every pool's workers). */}}
{{- define "duplex-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "duplex-gateway.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
duplex-gateway/worker-pool: {{ . }}
{{- end }}
{{- end -}}

{{/* "<fullname>-worker-<pool>": the fullname is cut, never the pool's name, so the pools'
names stay distinct within the 63 characters a Service name allows. */}}
{{- define "duplex-gateway.workerPoolName" -}}
{{- $room := sub 55 (len .pool) | int -}}
{{- printf "%s-worker-%s" (include "duplex-gateway.fullname" .root | trunc $room | trimSuffix "-") .pool -}}
{{- end -}}

{{/*
The worker pools as a JSON list (read it with fromJsonArray): each is `worker` with the pool's
own keys over it. The chart's own maps (image, gpu, model, probes, autoscaling, settings) merge
key by key, so a pool may change gpu.count or one setting alone; lists and the Kubernetes
structures below replace the worker's whole, so a pool that gives its own placement or limits
never runs with part of the shared ones mixed in.
*/}}
{{- define "duplex-gateway.workerPools" -}}
{{- $pools := list -}}
{{- $whole := list "resources" "nodeSelector" "affinity" "podAnnotations" "podLabels" -}}
{{- range .Values.workerPools -}}
{{- $pool := deepCopy $.Values.worker -}}
{{- include "duplex-gateway.mergeInto" (dict "base" $pool "over" . "whole" $whole) -}}
{{- $pools = append $pools $pool -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}

{{/* Set {over}'s keys into the map {base}, recursing into maps both have but those named in
{whole}. Not mergeOverwrite: it skips a zero value (gpu.count 0, enabled false, ""). */}}
{{- define "duplex-gateway.mergeInto" -}}
{{- $base := .base -}}
{{- range $key, $value := .over -}}
{{- $current := get $base $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $current) (not (has $key $.whole)) -}}
{{- include "duplex-gateway.mergeInto" (dict "base" $current "over" $value "whole" list) -}}
{{- else -}}
{{- $_ := set $base $key (deepCopy $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A worker pool's ConfigMap data: {root, settings}; its checksum rolls that pool's pods. */}}
{{- define "duplex-gateway.workerSettingsData" -}}
{{ include "duplex-gateway.settingsData" .settings | trim }}
{{ include "duplex-gateway.settingsData" .root.Values.logs | trim }}
{{- end -}}

{{- define "duplex-gateway.componentLabels" -}}
{{ include "duplex-gateway.labels" .root }}
{{ include "duplex-gateway.selectorLabels" . }}
{{- end -}}

{{- define "duplex-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "duplex-gateway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference: {root, image}; the tag defaults to the chart's appVersion. */}}
{{- define "duplex-gateway.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/*
The gateway's own shutdown after SIGTERM: uvicorn's timeout_graceful_shutdown in
duplex_gateway/cli.py (a test keeps the two equal). The grace period must cover the preStop
wait and this.
*/}}
{{- define "duplex-gateway.gatewayShutdownSeconds" -}}5{{- end -}}

{{/* One setting's value as DUPLEX_GATEWAY_* text: an integral number as an integer (helm reads
numbers as floats, and 16777216 would print as 1.6777216e+07), anything else as it is. */}}
{{- define "duplex-gateway.settingValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* A ConfigMap's data: DUPLEX_GATEWAY_<NAME>: "<value>" for each key of a settings map. */}}
{{- define "duplex-gateway.settingsData" -}}
{{- range $name, $value := . }}
{{ printf "DUPLEX_GATEWAY_%s" (upper $name) }}: {{ include "duplex-gateway.settingValue" $value | quote }}
{{- end }}
{{- end -}}

{{/* Whether the bundled Redis is deployed. */}}
{{- define "duplex-gateway.bundledRedis" -}}
{{- if eq .Values.redis.mode "bundled" -}}true{{- end -}}
{{- end -}}

{{/*
The Redis URL the processes get (DUPLEX_GATEWAY_REDIS_URL). With a password Secret the URL
carries "$(REDIS_PASSWORD)", which the kubelet replaces with the REDIS_PASSWORD variable set
just before it from the Secret: the password is in neither the pod spec nor a ConfigMap.
*/}}
{{- define "duplex-gateway.redisUrl" -}}
{{- $redis := .Values.redis -}}
{{- $auth := ternary ":$(REDIS_PASSWORD)@" "" (ne $redis.auth.existingSecret "") -}}
{{- if eq $redis.mode "bundled" -}}
{{- printf "redis://%s%s:6379/0" $auth (include "duplex-gateway.componentName" (dict "root" . "component" "redis")) -}}
{{- else if eq $redis.mode "external" -}}
{{- regexReplaceAll "^(rediss?)://" $redis.external.url (printf "${1}://%s" $auth) -}}
{{- else if eq $redis.mode "sentinel" -}}
{{- printf "redis+sentinel://%s%s/%s/%d" $auth (join "," $redis.sentinel.hosts) $redis.sentinel.service (int64 $redis.sentinel.db) -}}
{{- else if eq $redis.mode "cluster" -}}
{{- printf "redis+cluster://%s%s:%d" $auth $redis.cluster.host (int64 $redis.cluster.port) -}}
{{- end -}}
{{- end -}}

{{/* REDIS_PASSWORD from the Secret (when there is one), then the URL that uses it. */}}
{{- define "duplex-gateway.redisEnv" -}}
{{- if .Values.redis.auth.existingSecret }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.auth.existingSecret }}
      key: {{ .Values.redis.auth.existingSecretPasswordKey }}
{{- end }}
- name: DUPLEX_GATEWAY_REDIS_URL
  value: {{ include "duplex-gateway.redisUrl" . | quote }}
{{- end -}}

{{/* The Secret holding the API keys, or nothing when there are none. */}}
{{- define "duplex-gateway.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret -}}
{{- .Values.apiKeys.existingSecret -}}
{{- else if .Values.apiKeys.create -}}
{{- include "duplex-gateway.componentName" (dict "root" . "component" "api-keys") -}}
{{- end -}}
{{- end -}}

{{/* A monitoring toggle: true, false, or "auto" (on when the cluster serves the API). */}}
{{- define "duplex-gateway.enabled" -}}
{{- $enabled := .enabled -}}
{{- if eq (toString $enabled) "auto" -}}
{{- if .root.Capabilities.APIVersions.Has .api -}}true{{- end -}}
{{- else if $enabled -}}true{{- end -}}
{{- end -}}

{{/* The container securityContext of every container: nothing written outside its volumes. */}}
{{- define "duplex-gateway.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "duplex-gateway.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .runAsUser }}
runAsGroup: {{ .runAsGroup }}
fsGroup: {{ .fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Scheduling: {values} of one component (nodeSelector, tolerations, affinity). */}}
{{- define "duplex-gateway.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Relations the schema cannot state; a values file breaking one is refused with a sentence. */}}
{{- define "duplex-gateway.checks" -}}
{{- $gateway := .Values.gateway -}}
{{- $shutdown := include "duplex-gateway.gatewayShutdownSeconds" . | int -}}
{{- if le (int $gateway.drain.terminationGracePeriodSeconds) (add $gateway.drain.preStopSeconds $shutdown | int) -}}
{{- fail (printf "gateway.drain.terminationGracePeriodSeconds (%v) must exceed gateway.drain.preStopSeconds (%v) plus the gateway's %ds shutdown" $gateway.drain.terminationGracePeriodSeconds $gateway.drain.preStopSeconds $shutdown) -}}
{{- end -}}
{{- if gt (int $gateway.autoscaling.minReplicas) (int $gateway.autoscaling.maxReplicas) -}}
{{- fail "gateway.autoscaling.minReplicas must not exceed gateway.autoscaling.maxReplicas" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $pool := include "duplex-gateway.workerPools" . | fromJsonArray -}}
{{- include "duplex-gateway.poolChecks" $pool -}}
{{- if hasKey $seen $pool.name -}}
{{- fail (printf "workerPools: two pools are named %q (a pool's name is in its objects' names)" $pool.name) -}}
{{- end -}}
{{- $_ := set $seen $pool.name true -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (empty .Values.networkPolicy.ingressFrom) -}}
{{- fail "networkPolicy.ingressFrom is empty: with no peer the policy would let every pod reach the gateways" -}}
{{- end -}}
{{- end -}}

{{/* One worker pool's relations, after the pool's keys are merged over worker's: the messages
name the pool, since a value may come from either. */}}
{{- define "duplex-gateway.poolChecks" -}}
{{- $where := printf "worker pool %q" .name -}}
{{- if le (int .terminationGracePeriodSeconds) (int .drainTimeoutSeconds) -}}
{{- fail (printf "%s: terminationGracePeriodSeconds (%v) must exceed drainTimeoutSeconds (%v)" $where .terminationGracePeriodSeconds .drainTimeoutSeconds) -}}
{{- end -}}
{{- $model := .model -}}
{{- if and (eq $model.volume.type "persistentVolumeClaim") (not $model.volume.claimName) -}}
{{- fail (printf "%s: model.volume.claimName is empty (model.volume.type is persistentVolumeClaim)" $where) -}}
{{- end -}}
{{- if and (eq $model.volume.type "hostPath") (not (hasPrefix "/" $model.volume.hostPath)) -}}
{{- fail (printf "%s: model.volume.hostPath (%q) must be an absolute path (model.volume.type is hostPath)" $where $model.volume.hostPath) -}}
{{- end -}}
{{- if and (ne $model.volume.type "none") (not (hasPrefix (printf "%s/" (trimSuffix "/" $model.mountPath)) $model.path)) (ne $model.path $model.mountPath) -}}
{{- fail (printf "%s: model.path (%q) must be inside model.mountPath (%q), where the model volume is mounted" $where $model.path $model.mountPath) -}}
{{- end -}}
{{- $autoscaling := .autoscaling -}}
{{- if gt (int $autoscaling.minReplicas) (int $autoscaling.maxReplicas) -}}
{{- fail (printf "%s: autoscaling.minReplicas must not exceed autoscaling.maxReplicas" $where) -}}
{{- end -}}
{{- if $autoscaling.enabled -}}
{{- if not (dig "requests" "cpu" "" .resources) -}}
{{- fail (printf "%s: autoscaling needs resources.requests.cpu (the autoscaler aims at a share of it)" $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The bundled Redis's configuration (no secret in it: requirepass is added at start). */}}
{{- define "duplex-gateway.redisConf" -}}
bind * -::*
port 6379
# The pod network is the boundary (see networkPolicy); a password comes from redis.auth.
protected-mode no
dir /data
appendonly yes
appendfsync {{ .Values.redis.bundled.appendfsync }}
# Evicting a session's keys would break it silently: refuse writes when full instead.
maxmemory-policy noeviction
{{- end -}}
