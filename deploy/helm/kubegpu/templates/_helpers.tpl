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

{{- define "kubegpu.uiSelectorLabels" -}}
app.kubernetes.io/name: kubegpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ui
{{- end -}}

{{/* The profile's schedulerName. */}}
{{- define "kubegpu.schedulerName" -}}
{{- if eq .Values.mode "only" -}}default-scheduler{{- else -}}{{ .Values.schedulerName }}{{- end -}}
{{- end -}}

{{- define "kubegpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The leader-election Lease: in mode only the stock scheduler's own
(kube-system/kube-scheduler), so that the chart's replicas stand by while
a stock kube-scheduler still leads, and never two serve default-scheduler. */}}
{{- define "kubegpu.leaseName" -}}
{{- if .Values.leaderElection.leaseName -}}{{ .Values.leaderElection.leaseName }}{{- else if eq .Values.mode "only" -}}kube-scheduler{{- else -}}kubegpu-scheduler{{- end -}}
{{- end -}}
{{- define "kubegpu.leaseNamespace" -}}
{{- if eq .Values.mode "only" -}}kube-system{{- else -}}{{ .Release.Namespace }}{{- end -}}
{{- end -}}

{{/* Values that render but would not run: refused with the fix. */}}
{{- define "kubegpu.validate" -}}
{{- if and (eq .Values.mode "only") (or (lt (int .Values.replicaCount) 2) (not .Values.leaderElection.enabled)) -}}
{{- fail "mode only needs replicaCount of 2 or more with leader election: a replica being replaced is scheduled by the others, and with one nothing would schedule its successor" -}}
{{- end -}}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicaCount) 1) -}}
{{- fail "leaderElection.enabled=false with more than one replica would run several active schedulers: set replicaCount=1 or enable leader election" -}}
{{- end -}}
{{- if and .Values.apiServer.host (not .Values.apiServer.port) -}}
{{- fail "apiServer.host needs apiServer.port (e.g. 6443)" -}}
{{- end -}}
{{- if and .Values.hostNetwork .Values.networkPolicy.enabled -}}
{{- fail "networkPolicy.enabled=true does nothing with hostNetwork=true: a NetworkPolicy does not apply to pods on the host's network" -}}
{{- end -}}
{{- if regexMatch "(^|,) *GangScheduling *=" (.Values.featureGates | default "") -}}
{{- fail "featureGates: kube-scheduler v1.37 has no GangScheduling gate (it would not start): GenericWorkload=true alone turns gang scheduling on" -}}
{{- end -}}
{{- if and .Values.hostNetwork (eq (int .Values.securePort) 10259) -}}
{{- fail "with hostNetwork=true set securePort to a port other than 10259, kube-scheduler's, which a control-plane node already uses (e.g. 10269)" -}}
{{- end -}}
{{- end -}}

{{/* kubegpu.kept marks every object of a shipped manifest (each has the
label app.kubernetes.io/part-of: kubegpu and no annotations) to be kept by
helm uninstall: the admission policies, the PriorityClass and the
ClusterRoles stay in force, and objects an earlier installation made and
the release adopted are not taken away with it. */}}
{{- define "kubegpu.kept" -}}
{{- $kept := . | replace "\n  labels:\n    app.kubernetes.io/part-of: kubegpu\n" "\n  annotations:\n    helm.sh/resource-policy: keep\n  labels:\n    app.kubernetes.io/part-of: kubegpu\n" -}}
{{- if ne (len (regexFindAll "(?m)^kind: " $kept -1)) (len (regexFindAll "helm.sh/resource-policy: keep" $kept -1)) -}}
{{- fail "kubegpu.kept: an object of a shipped manifest lacks the label app.kubernetes.io/part-of: kubegpu where it is looked for (first in metadata.labels, LF line ends): it would not be kept by helm uninstall" -}}
{{- end -}}
{{- $kept -}}
{{- end -}}
