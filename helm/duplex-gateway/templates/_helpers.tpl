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

{{/* The labels that select one component's pods: {root, component}. */}}
{{- define "duplex-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "duplex-gateway.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
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
{{- $worker := .Values.worker -}}
{{- if le (int $worker.terminationGracePeriodSeconds) (int $worker.drainTimeoutSeconds) -}}
{{- fail (printf "worker.terminationGracePeriodSeconds (%v) must exceed worker.drainTimeoutSeconds (%v)" $worker.terminationGracePeriodSeconds $worker.drainTimeoutSeconds) -}}
{{- end -}}
{{- if gt (int $gateway.autoscaling.minReplicas) (int $gateway.autoscaling.maxReplicas) -}}
{{- fail "gateway.autoscaling.minReplicas must not exceed gateway.autoscaling.maxReplicas" -}}
{{- end -}}
{{- $model := $worker.model -}}
{{- if and (ne $model.volume.type "none") (not (hasPrefix (printf "%s/" (trimSuffix "/" $model.mountPath)) $model.path)) (ne $model.path $model.mountPath) -}}
{{- fail (printf "worker.model.path (%q) must be inside worker.model.mountPath (%q), where the model volume is mounted" $model.path $model.mountPath) -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (empty .Values.networkPolicy.ingressFrom) -}}
{{- fail "networkPolicy.ingressFrom is empty: with no peer the policy would let every pod reach the gateways" -}}
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
