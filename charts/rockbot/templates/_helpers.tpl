{{/* Names, labels and shared pieces of the rockbot chart. */}}

{{- define "rockbot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rockbot.fullname" -}}
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

{{/* Name of one component's resources: "<fullname>-<component>". Call with (list $ "operator"). */}}
{{- define "rockbot.componentName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "rockbot.fullname" $root | trunc 45 | trimSuffix "-") (index . 1) -}}
{{- end -}}

{{/* Standard labels of every object. */}}
{{- define "rockbot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "rockbot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rockbot
{{- end -}}

{{/* Labels of one component's objects. Call with (list $ "operator"). */}}
{{- define "rockbot.componentLabels" -}}
{{ include "rockbot.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels selecting one component's pods (stable across upgrades). Call with (list $ "operator"). */}}
{{- define "rockbot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rockbot.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The rockbot image reference; the tag defaults to the chart's appVersion. */}}
{{- define "rockbot.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The script pods' image: scripts.image, or the chart's data-science image of the same repository and tag. */}}
{{- define "rockbot.scriptsImage" -}}
{{- .Values.scripts.image | default (printf "%s-scripts:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{/* Namespaces where Agents run: the release namespace, then agentNamespaces, without repeats. */}}
{{- define "rockbot.agentNamespaces" -}}
{{- prepend .Values.agentNamespaces .Release.Namespace | uniq | toJson -}}
{{- end -}}

{{/* In-cluster host name of the bundled RabbitMQ, reachable from every namespace. */}}
{{- define "rockbot.rabbitmq.host" -}}
{{- printf "%s.%s.svc" (include "rockbot.componentName" (list . "rabbitmq")) .Release.Namespace -}}
{{- end -}}

{{/*
The bundled RabbitMQ's credentials as JSON {username, password}. The password is read back from the
Secret of an earlier install (so upgrades keep it), else taken from values, else generated; the result
is remembered for this render so every template that asks gets the same password.
*/}}
{{- define "rockbot.rabbitmq.credentials" -}}
{{- if not (hasKey .Values.rabbitmq "generatedCredentials") -}}
{{- $name := include "rockbot.componentName" (list . "rabbitmq") -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $password := .Values.rabbitmq.auth.password -}}
{{- if and (not $password) $existing $existing.data -}}
{{- $password = index $existing.data "password" | b64dec -}}
{{- end -}}
{{- if not $password -}}
{{- $password = randAlphaNum 32 -}}
{{- end -}}
{{- $_ := set .Values.rabbitmq "generatedCredentials" (dict "username" .Values.rabbitmq.auth.username "password" $password) -}}
{{- end -}}
{{- toJson .Values.rabbitmq.generatedCredentials -}}
{{- end -}}

{{/* The broker's address as JSON {scheme, host (with port), path (the vhost)}: no credentials. */}}
{{- define "rockbot.broker" -}}
{{- if .Values.rabbitmq.enabled -}}
{{- dict "scheme" "amqp" "host" (printf "%s:5672" (include "rockbot.rabbitmq.host" .)) "path" "/" | toJson -}}
{{- else -}}
{{- $url := urlParse .Values.externalBroker.url -}}
{{- dict "scheme" $url.scheme "host" $url.host "path" (default "/" $url.path) | toJson -}}
{{- end -}}
{{- end -}}

{{/* The broker as agents reach it, without credentials (the operator adds each agent's own login). */}}
{{- define "rockbot.brokerAddress" -}}
{{- $broker := include "rockbot.broker" . | fromJson -}}
{{- printf "%s://%s%s" $broker.scheme $broker.host $broker.path -}}
{{- end -}}

{{/* RabbitMQ's management API, which only the operator calls (as the broker's administrator). */}}
{{- define "rockbot.managementURL" -}}
{{- if .Values.rabbitmq.enabled -}}
{{- printf "http://%s:15672/" (include "rockbot.rabbitmq.host" .) -}}
{{- else -}}
{{- default (printf "http://%s:15672/" (urlParse .Values.externalBroker.url).hostname) .Values.externalBroker.managementURL -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the broker administrator's username and password (keys `username`, `password`). */}}
{{- define "rockbot.brokerAdminSecret" -}}
{{- if .Values.rabbitmq.enabled -}}
{{- include "rockbot.componentName" (list . "rabbitmq") -}}
{{- else -}}
{{- default (include "rockbot.componentName" (list . "broker-admin")) .Values.externalBroker.existingSecret -}}
{{- end -}}
{{- end -}}

{{/*
The password of a service's own broker user (call with (list $ "operator")): read back from the Secret
of an earlier install, else generated; remembered for this render so every template gets the same.
*/}}
{{- define "rockbot.servicePassword" -}}
{{- $root := index . 0 -}}
{{- $service := index . 1 -}}
{{- $remembered := $root.Values.rabbitmq.generatedServicePasswords | default dict -}}
{{- if not (hasKey $remembered $service) -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace (include "rockbot.componentName" (list $root (printf "%s-bus" $service))) -}}
{{- $password := "" -}}
{{- if and $existing $existing.data -}}
{{- $password = index $existing.data "password" | b64dec -}}
{{- end -}}
{{- $_ := set $remembered $service (default (randAlphaNum 32) $password) -}}
{{- $_ := set $root.Values.rabbitmq "generatedServicePasswords" $remembered -}}
{{- end -}}
{{- index $remembered $service -}}
{{- end -}}

{{/* Environment variable carrying one service's own broker login. Call with (list $ "operator" "ROCKBOT_AMQP_URL"). */}}
{{- define "rockbot.serviceLoginEnv" -}}
- name: {{ index . 2 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "rockbot.componentName" (list (index . 0) (printf "%s-bus" (index . 1))) }}
      key: amqp-url
{{- end -}}

{{/* Where senders reach the gateway's webhooks: gateway.publicUrl, else the Ingress, else the Service. */}}
{{- define "rockbot.gatewayPublicURL" -}}
{{- $gateway := .Values.gateway -}}
{{- if $gateway.publicUrl -}}
{{- $gateway.publicUrl | trimSuffix "/" -}}
{{- else if $gateway.ingress.enabled -}}
{{- printf "%s://%s" (ternary "https" "http" (not (empty $gateway.ingress.tlsSecretName))) $gateway.ingress.host -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" (not (empty $gateway.tlsSecretName))) (include "rockbot.componentName" (list . "gateway")) .Release.Namespace $gateway.service.port -}}
{{- end -}}
{{- end -}}

{{/* Pod-level security context of every rockbot pod (Pod Security "restricted"). */}}
{{- define "rockbot.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security context of every container (Pod Security "restricted"). */}}
{{- define "rockbot.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Fail the render early when the broker settings cannot work together. */}}
{{- define "rockbot.validate" -}}
{{- if and (not .Values.rabbitmq.enabled) (not .Values.externalBroker.url) -}}
{{- fail "rabbitmq.enabled is false but no broker is given: set externalBroker.url, or set rabbitmq.enabled=true" -}}
{{- end -}}
{{- if and (not .Values.rabbitmq.enabled) .Values.externalBroker.url (not (urlParse .Values.externalBroker.url).userinfo) (not .Values.externalBroker.existingSecret) -}}
{{- fail "externalBroker.url names no administrator: put one in it (amqp://ADMIN:PASSWORD@host:5672/vhost), or name a Secret with keys username and password in externalBroker.existingSecret" -}}
{{- end -}}
{{- if and (not .Values.rabbitmq.enabled) .Values.agents.egress.enabled (not .Values.externalBroker.cidrs) -}}
{{- fail "rabbitmq.enabled is false and agents.egress.enabled is true, but externalBroker.cidrs is empty: agent pods could not reach the broker; set externalBroker.cidrs to the broker's address ranges (and externalBroker.port), or set agents.egress.enabled=false to manage agent egress yourself" -}}
{{- end -}}
{{- if has .Values.scripts.namespace (include "rockbot.agentNamespaces" . | fromJsonArray) -}}
{{- fail (printf "scripts.namespace %q is also a namespace where agents run: script pods need a namespace of their own; pick another scripts.namespace" .Values.scripts.namespace) -}}
{{- end -}}
{{- if and (not .Values.rabbitmq.enabled) .Values.gateway.enabled .Values.gateway.networkPolicy.enabled (not .Values.externalBroker.cidrs) -}}
{{- fail "rabbitmq.enabled is false and gateway.networkPolicy.enabled is true, but externalBroker.cidrs is empty: the gateway could not reach the broker; set externalBroker.cidrs, or set gateway.networkPolicy.enabled=false" -}}
{{- end -}}
{{- if and .Values.gateway.enabled .Values.gateway.ingress.enabled (not .Values.gateway.ingress.host) -}}
{{- fail "gateway.ingress.enabled is true but gateway.ingress.host is empty: name the host senders use, e.g. hooks.example.com" -}}
{{- end -}}
{{- if and .Values.telemetry.otlpEndpoint (or .Values.agents.egress.enabled (and .Values.gateway.enabled .Values.gateway.networkPolicy.enabled)) (not .Values.telemetry.collectorEgressTo) -}}
{{- fail "telemetry.otlpEndpoint is set but telemetry.collectorEgressTo is empty: the egress policies of agent pods and the gateway would block their spans; name the collector's pods or addresses there (NetworkPolicyPeer list)" -}}
{{- end -}}
{{- if and .Values.openrouterMcp.enabled (not .Values.openrouterMcp.apiKeySecret.name) -}}
{{- fail "openrouterMcp.enabled is true but openrouterMcp.apiKeySecret.name is empty: name the Secret holding the OpenRouter API key" -}}
{{- end -}}
{{- end -}}

{{/* OTEL_* variables of a rockbot process: where its traces go, when a collector is configured. */}}
{{- define "rockbot.telemetryEnv" -}}
{{- with .Values.telemetry.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* NetworkPolicy egress rule towards the OpenTelemetry collector (only when traces are exported). */}}
{{- define "rockbot.collectorEgressRule" -}}
{{- if and .Values.telemetry.otlpEndpoint .Values.telemetry.collectorEgressTo }}
- to:
    {{- toYaml .Values.telemetry.collectorEgressTo | nindent 4 }}
  ports:
    {{- range .Values.telemetry.collectorPorts }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
{{- end }}
{{- end -}}

{{/* NetworkPolicy egress rule allowing DNS lookups at the cluster DNS pods. */}}
{{- define "rockbot.dnsEgressRule" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.dns.podLabels | nindent 10 }}
  ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
{{- end -}}

{{/*
RabbitMQ configuration: every user connects from other pods, so loopback_users is off; a message is
at most the bus's limit (rockbot.bus.topology.MAX_MESSAGE_BYTES), so none can exhaust a consumer.
*/}}
{{- define "rockbot.rabbitmq.config" -}}
loopback_users = none
listeners.tcp.default = 5672
management.tcp.port = 15672
max_message_size = 8388608
log.console = true
log.console.level = info
log.file = false
{{- end -}}

{{/* The warm pool as ROCKBOT_SCRIPTS_POOL (`CPU/MEMORY=SIZE,...`), classes of size 0 left out; empty: off. */}}
{{- define "rockbot.scriptsPool" -}}
{{- $classes := list -}}
{{- range .Values.scripts.pool -}}
{{- if gt (int .size) 0 -}}
{{- $classes = append $classes (printf "%s/%s=%d" .cpu .memory (int .size)) -}}
{{- end -}}
{{- end -}}
{{- join "," $classes -}}
{{- end -}}

{{/* Isolation canary targets as JSON for ROCKBOT_*_ISOLATION_TARGETS: a probe set to null is left out. */}}
{{- define "rockbot.isolationTargets" -}}
{{- $targets := dict -}}
{{- range $probe, $uris := . }}{{ if kindIs "slice" $uris }}{{ $_ := set $targets $probe $uris }}{{ end }}{{ end -}}
{{- toJson $targets -}}
{{- end }}
