{{/* The scheduler's objects are named after the release. */}}
{{- define "kubegpu.scheduler" -}}
{{- printf "%s-scheduler" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubegpu.labels" -}}
app.kubernetes.io/name: kubegpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubegpu
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kubegpu.selectorLabels" -}}
app.kubernetes.io/name: kubegpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{/* The profile's schedulerName. */}}
{{- define "kubegpu.schedulerName" -}}
{{- if eq .Values.mode "only" -}}default-scheduler{{- else -}}{{ .Values.schedulerName }}{{- end -}}
{{- end -}}

{{- define "kubegpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
