{{/* The release's base name: <release>-<role>, at most 63 characters. */}}
{{- define "atoll.fullname" -}}
{{- if contains .Values.role .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Values.role | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "atoll.selectorLabels" -}}
app.kubernetes.io/name: atoll
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.role }}-parent
{{- end -}}

{{- define "atoll.labels" -}}
{{ include "atoll.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "atoll.jobNamespace" -}}
{{- default .Release.Namespace .Values.jobNamespace -}}
{{- end -}}

{{- define "atoll.serviceAccountName" -}}
{{- default (include "atoll.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* local/site.yaml: the given config, with the in-cluster defaults filled in. */}}
{{- define "atoll.siteYaml" -}}
{{- $config := deepCopy .Values.config.site -}}
{{- if eq (toString $config.launcher) "k8s" -}}
{{- $k8s := deepCopy (default (dict) $config.k8s) -}}
{{- if not (or (hasKey $k8s "kubeconfig") (hasKey $k8s "in_cluster")) -}}
{{- $_ := set $k8s "in_cluster" true -}}
{{- end -}}
{{- if not (hasKey $k8s "namespace") -}}
{{- $_ := set $k8s "namespace" (include "atoll.jobNamespace" .) -}}
{{- end -}}
{{- $_ := set $config "k8s" $k8s -}}
{{- end -}}
{{- if not (hasKey $config "worker_endpoint") -}}
{{- $_ := set $config "worker_endpoint" (dict "host" "__POD_IP__" "port" (int .Values.workerPort)) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The labels of this parent's job Pods (set by atoll's Kubernetes launcher). */}}
{{- define "atoll.jobPodLabels" -}}
app.kubernetes.io/managed-by: atoll
atoll.dev/role: {{ .Values.role }}
{{- with .Values.jobPodLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The same labels as a label selector (key=value,...). */}}
{{- define "atoll.jobPodSelector" -}}
{{- $pairs := list -}}
{{- range $key, $value := (include "atoll.jobPodLabels" . | fromYaml) -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
