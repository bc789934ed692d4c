{{/*
Names and labels. Selector labels are fixed (name, instance, component) and never include
user labels (commonLabels, podLabels), so changing those never breaks a Deployment's selector.
*/}}

{{- define "pagoda.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pagoda.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The full name with a suffix, ("-operator", "-metrics", ...), at most 63 characters: the
full name is cut to fit before the suffix, never the suffix (cutting the whole gave a 63-character
full name itself for every suffix: the operator's and the metrics Service one name). Called with
(list . "SUFFIX"). */}}
{{- define "pagoda.suffixed" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" (include "pagoda.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end }}

{{/* Name of the operator's Deployment, Service, ClusterRole, ... */}}
{{- define "pagoda.operatorName" -}}
{{- include "pagoda.suffixed" (list . "operator") }}
{{- end }}

{{/* The headless Service the operator ServiceMonitor scrapes: every operator pod, the standby
ones too (the operator Service selects the active one only). */}}
{{- define "pagoda.metricsServiceName" -}}
{{- include "pagoda.suffixed" (list . "metrics") }}
{{- end }}

{{- define "pagoda.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of the operator pod: stable for the life of the release. */}}
{{- define "pagoda.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagoda.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object: selector labels, chart metadata, then the user's commonLabels
(which cannot override the standard ones). */}}
{{- define "pagoda.labels" -}}
{{- $std := dict
  "helm.sh/chart" (include "pagoda.chart" .)
  "app.kubernetes.io/managed-by" .Release.Service
  "app.kubernetes.io/part-of" "pagoda"
  "app.kubernetes.io/version" (.Chart.AppVersion | toString)
-}}
{{- $labels := merge (dict) (include "pagoda.selectorLabels" . | fromYaml) $std (.Values.commonLabels | default dict) -}}
{{ toYaml $labels }}
{{- end }}

{{/* Labels of monitoring objects: standard labels plus monitoring.labels. */}}
{{- define "pagoda.monitoringLabels" -}}
{{- $labels := merge (include "pagoda.labels" . | fromYaml) (.Values.monitoring.labels | default dict) -}}
{{ toYaml $labels }}
{{- end }}

{{- define "pagoda.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pagoda.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest; the tag defaults to the chart's appVersion. */}}
{{- define "pagoda.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- $tag := default ($root.Chart.AppVersion | toString) ($image.tag | toString) -}}
{{- if eq $tag "latest" -}}
{{- fail "image tag \"latest\" is not allowed: pin a version" -}}
{{- end -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}
{{- end }}

{{/* Secret holding the Alertmanager webhook token; empty when none is configured. */}}
{{- define "pagoda.webhookSecretName" -}}
{{- $s := .Values.webhook.tokenSecret -}}
{{- if $s.name -}}
{{- $s.name -}}
{{- else if $s.create -}}
{{- include "pagoda.suffixed" (list . "webhook") -}}
{{- end -}}
{{- end }}

{{/* In-cluster URL of the operator's alert webhook (https with webhook.tls.secretName). */}}
{{- define "pagoda.webhookURL" -}}
{{- printf "%s://%s/alerts" (include "pagoda.scheme" .) (include "pagoda.operatorHost" .) -}}
{{- end }}

{{/* host:port of the operator Service; the name its TLS certificate must carry. */}}
{{- define "pagoda.operatorHost" -}}
{{- printf "%s.%s.svc:%v" (include "pagoda.operatorName" .) .Release.Namespace .Values.service.port -}}
{{- end }}

{{/* http, or https when the operator serves TLS (webhook.tls.secretName). */}}
{{- define "pagoda.scheme" -}}
{{- if .Values.webhook.tls.secretName }}https{{ else }}http{{ end -}}
{{- end }}

{{/* The kopf peering object's name with operator.replicas > 1; empty for one replica. */}}
{{- define "pagoda.peeringName" -}}
{{- if gt (int .Values.operator.replicas) 1 }}{{ include "pagoda.operatorName" . }}{{ end -}}
{{- end }}

{{/* The Prometheus Operator's SafeTLSConfig verifying the operator's certificate. */}}
{{- define "pagoda.operatorTlsConfig" -}}
ca:
  secret:
    name: {{ .Values.webhook.tls.secretName }}
    key: {{ .Values.webhook.tls.caKey }}
serverName: {{ printf "%s.%s.svc" (include "pagoda.operatorName" .) .Release.Namespace }}
{{- end }}

{{/*
The operator's RBAC, mirroring pagoda.operator.kube.rbac.API_PERMISSIONS exactly
(tests/charts/test_chart_rbac.py compares them). Namespaced resources go to the ClusterRole
(all namespaces) or to one Role per watched namespace; cluster-scoped ones always go to the
ClusterRole.
*/}}
{{- define "pagoda.rbac.namespacedRules" -}}
- apiGroups: ["serving.pagoda.dev"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["serving.pagoda.dev"]
  resources: ["inferenceservices/status"]
  verbs: ["get", "patch"]
- apiGroups: ["serving.pagoda.dev"]
  resources: ["inferenceservices/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors", "prometheusrules"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
{{- if .Values.modelPinning.enabled }}
{{- /* model pinning: the HF_TOKEN of the Secret spec.modelSecretRef names, to resolve an hf:// branch */}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- if and (include "pagoda.peeringName" .) .Values.watchNamespaces }}
{{- /* several replicas, namespaced: kopf's KopfPeering in each served namespace */}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if .Values.autotune.enabled }}
{{- /* autotuning: one Job per key; the Job's ServiceAccount may only get/patch its profile ConfigMap */}}
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create"]
{{- end }}
{{- end }}

{{- define "pagoda.rbac.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
{{- if and (include "pagoda.peeringName" .) (not .Values.watchNamespaces) }}
{{- /* several replicas, cluster-wide: kopf's ClusterKopfPeering */}}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{/*
A Prometheus duration (30s, 1m30s, 500ms, 0) in milliseconds.
*/}}
{{- define "pagoda.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" (toString .) -1 -}}
{{- $total = add $total (mul (regexFind "^[0-9]+" .) (get $units (regexReplaceAll "^[0-9]+" . ""))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
Fail when a ServiceMonitor's scrapeTimeout exceeds its interval: Prometheus refuses that scrape
config (the Prometheus Operator drops the ServiceMonitor), so nothing would be scraped.
Call with (dict "name" KEY "interval" I "scrapeTimeout" T).
*/}}
{{- define "pagoda.checkScrapeTimeout" -}}
{{- $interval := include "pagoda.durationMs" .interval | int64 -}}
{{- $timeout := include "pagoda.durationMs" .scrapeTimeout | int64 -}}
{{- if and (gt $interval 0) (gt $timeout $interval) -}}
{{- fail (printf "monitoring.%s.scrapeTimeout (%s) must not exceed monitoring.%s.interval (%s): Prometheus refuses such a scrape" .name .scrapeTimeout .name .interval) -}}
{{- end -}}
{{- end -}}
