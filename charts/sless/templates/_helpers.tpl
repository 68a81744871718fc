{{/* Every helper is prefixed "sless." so it cannot clash with a parent chart's. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "sless.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object: release name (plus chart name unless the release holds it). */}}
{{- define "sless.fullname" -}}
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

{{/* chart label value: name-version */}}
{{- define "sless.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "sless.labels" -}}
helm.sh/chart: {{ include "sless.chart" . }}
{{ include "sless.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sless
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels that select this release's pods (add app.kubernetes.io/component per workload). */}}
{{- define "sless.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sless.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Component-scoped names and labels: include with (dict "root" $ "component" "api"). */}}
{{- define "sless.componentName" -}}
{{- printf "%s-%s" (include "sless.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component -}}
{{- end -}}
{{- define "sless.componentLabels" -}}
{{ include "sless.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}
{{- define "sless.componentSelectorLabels" -}}
{{ include "sless.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* ServiceAccount names. */}}
{{- define "sless.api.serviceAccountName" -}}
{{- if .Values.api.serviceAccount.create -}}
{{- default (include "sless.componentName" (dict "root" . "component" "api")) .Values.api.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.api.serviceAccount.name -}}
{{- end -}}
{{- end -}}
{{- define "sless.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "sless.componentName" (dict "root" . "component" "operator")) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sless.events.serviceAccountName" -}}
{{- if .Values.events.serviceAccount.create -}}
{{- default (include "sless.componentName" (dict "root" . "component" "events")) .Values.events.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.events.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sless.scaler.serviceAccountName" -}}
{{- if .Values.scaler.serviceAccount.create -}}
{{- default (include "sless.componentName" (dict "root" . "component" "scaler")) .Values.scaler.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.scaler.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* sless-scaler: its Service's name and the address every ScaledObject and every reporter dials (the Service's
DNS name, which KEDA resolves from its own namespace). */}}
{{- define "sless.scaler.address" -}}
{{- printf "%s.%s.svc:%d" (include "sless.componentName" (dict "root" . "component" "scaler")) .Release.Namespace (int .Values.scaler.port) -}}
{{- end -}}

{{/* The Secret holding the scaler's report token: secrets.scaler.name, else the one the chart generates. */}}
{{- define "sless.scaler.tokenSecretName" -}}
{{- default (include "sless.componentName" (dict "root" . "component" "scaler-token")) .Values.secrets.scaler.name -}}
{{- end -}}

{{/* Where the scaler, the API and the event dispatcher find the token (SLESS_SCALER_TOKEN_FILE). */}}
{{- define "sless.scaler.tokenDir" -}}/var/run/sless/scaler{{- end -}}

{{/* The egress rule (a list item) to sless-scaler's pods, for the API's and the dispatcher's NetworkPolicies. */}}
{{- define "sless.scaler.egress" -}}
{{- if .Values.scaler.enabled }}
    - to:
        - podSelector:
            matchLabels:
              {{- include "sless.componentSelectorLabels" (dict "root" . "component" "scaler") | nindent 14 }}
      ports:
        - protocol: TCP
          port: {{ .Values.scaler.port }}
{{- end }}
{{- end -}}

{{/* The token's env, volume mount and volume, for each pod that holds it (include with the root context). */}}
{{- define "sless.scaler.tokenEnv" -}}
- name: SLESS_SCALER_TOKEN_FILE
  value: {{ printf "%s/token" (include "sless.scaler.tokenDir" .) | quote }}
{{- end -}}
{{- define "sless.scaler.tokenMount" -}}
- name: scaler-token
  mountPath: {{ include "sless.scaler.tokenDir" . }}
  readOnly: true
{{- end -}}
{{- define "sless.scaler.tokenVolume" -}}
- name: scaler-token
  secret:
    secretName: {{ include "sless.scaler.tokenSecretName" . }}
    defaultMode: 288  # 0440: the pods' group (fsGroup) reads it
    items:
      - key: {{ .Values.secrets.scaler.key }}
        path: token
{{- end -}}

{{/* "true" when the event dispatcher runs: events.enabled and a RabbitMQ Secret to consume from. */}}
{{- define "sless.events.enabled" -}}
{{- if and .Values.events.enabled .Values.secrets.rabbitmq.name -}}true{{- end -}}
{{- end -}}

{{/* The platform image: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "sless.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Seconds the Ingress waits for the API: the longest function call, the proxy margin, 10 s slack. */}}
{{- define "sless.ingressTimeoutSec" -}}
{{- add .Values.limits.maxTimeoutSec .Values.limits.proxyTimeoutMarginSec 10 -}}
{{- end -}}

{{/* Seconds a stopping API pod waits for its calls in flight: the longest call (maxTimeoutSec plus the proxy's
margin) or stream (streamMaxSec), as sless-api's graceful timeout computes it. */}}
{{- define "sless.api.drainSec" -}}
{{- max (add .Values.limits.maxTimeoutSec .Values.limits.proxyTimeoutMarginSec) .Values.limits.streamMaxSec -}}
{{- end -}}

{{/* The ConfigMap of the platform's non-secret settings. */}}
{{- define "sless.configMapName" -}}
{{- include "sless.componentName" (dict "root" . "component" "config") -}}
{{- end -}}

{{/* Pod-level settings shared by the API, the operator and the test hook. */}}
{{- define "sless.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Secret-backed environment variables (by name and key; values never pass through the chart). */}}
{{- define "sless.secretEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end -}}
