{{- define "kart.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kart.operatorName" -}}
{{- printf "%s-operator" (include "kart.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kart.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: kart
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The operator pod's selector; workloads carry app.kubernetes.io/name=kart instead. */}}
{{- define "kart.operatorSelector" -}}
app.kubernetes.io/name: kart-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kart.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kart.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kart.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* Namespaces whose kart workloads the monitors and network policies cover. */}}
{{- define "kart.workloadNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- toJson .Values.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- /* What the operator needs wherever it reconciles: its custom resources, the workloads it owns,
  pods (read-only, for status) and events. */}}
{{- define "kart.operatorRules" -}}
- apiGroups: [kart.dev]
  resources: [retrievers, rolloutpools, trainingjobs]
  verbs: [get, list, watch, patch, update]
- apiGroups: [kart.dev]
  resources: [retrievers/status, rolloutpools/status, trainingjobs/status]
  verbs: [get, patch, update]
- apiGroups: [kart.dev]
  resources: [retrievers/finalizers, rolloutpools/finalizers, trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [kart.dev]
  resources: [rolloutpools/scale]
  verbs: [get]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services, configmaps, persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# Each RolloutPool's token Secret: created once, read back, never listed or watched.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.kueue.enabled }}
# TrainingJobs with spec.queueName: their trainer Jobs' Kueue Workloads (why a Job waits).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list]
{{- end }}
{{- end }}
