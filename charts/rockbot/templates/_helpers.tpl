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

{{/* Namespaces where Agents run: the release namespace, then agentNamespaces, without repeats. */}}
{{- define "rockbot.agentNamespaces" -}}
{{- prepend .Values.agentNamespaces .Release.Namespace | uniq | toJson -}}
{{- end -}}

{{/* Name of the Secret holding the AMQP URL. */}}
{{- define "rockbot.busSecretName" -}}
{{- default .Values.bus.secretName .Values.externalBroker.existingSecret -}}
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

{{/* The AMQP URL written into the bus Secrets. */}}
{{- define "rockbot.amqpURL" -}}
{{- if .Values.rabbitmq.enabled -}}
{{- $credentials := include "rockbot.rabbitmq.credentials" . | fromJson -}}
{{- printf "amqp://%s:%s@%s:5672/" ($credentials.username | urlquery) ($credentials.password | urlquery) (include "rockbot.rabbitmq.host" .) -}}
{{- else -}}
{{- .Values.externalBroker.url -}}
{{- end -}}
{{- end -}}

{{/* Environment variable carrying the AMQP URL from the bus Secret. */}}
{{- define "rockbot.amqpEnv" -}}
- name: ROCKBOT_AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "rockbot.busSecretName" . }}
      key: {{ .Values.bus.secretKey }}
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
{{- if and (not .Values.rabbitmq.enabled) (not .Values.externalBroker.url) (not .Values.externalBroker.existingSecret) -}}
{{- fail "rabbitmq.enabled is false but no broker is given: set externalBroker.url (or externalBroker.existingSecret), or set rabbitmq.enabled=true" -}}
{{- end -}}
{{- if and (not .Values.rabbitmq.enabled) .Values.agents.egress.enabled (not .Values.externalBroker.cidrs) -}}
{{- fail "rabbitmq.enabled is false and agents.egress.enabled is true, but externalBroker.cidrs is empty: agent pods could not reach the broker; set externalBroker.cidrs to the broker's address ranges (and externalBroker.port), or set agents.egress.enabled=false to manage agent egress yourself" -}}
{{- end -}}
{{- if has .Values.scripts.namespace (include "rockbot.agentNamespaces" . | fromJsonArray) -}}
{{- fail (printf "scripts.namespace %q is also a namespace where agents run: script pods need a namespace of their own; pick another scripts.namespace" .Values.scripts.namespace) -}}
{{- end -}}
{{- if and .Values.openrouterMcp.enabled (not .Values.openrouterMcp.apiKeySecret.name) -}}
{{- fail "openrouterMcp.enabled is true but openrouterMcp.apiKeySecret.name is empty: name the Secret holding the OpenRouter API key" -}}
{{- end -}}
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

{{/* RabbitMQ configuration: the rockbot user connects from other pods, so loopback_users is off. */}}
{{- define "rockbot.rabbitmq.config" -}}
loopback_users = none
listeners.tcp.default = 5672
management.tcp.port = 15672
log.console = true
log.console.level = info
log.file = false
{{- end -}}
