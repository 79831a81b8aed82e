{{/* Names: <release>-<chart> unless the release already carries the chart's name. */}}
{{- define "image-classifier.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "image-classifier.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
image-classifier/mode: {{ .Values.mode }}
{{- end -}}

{{/* The Triton pods: what the Service, PDB and metrics select. */}}
{{- define "image-classifier.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "image-classifier.locustMasterLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: locust-master
{{- end -}}

{{- define "image-classifier.locustWorkerLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: locust-worker
{{- end -}}

{{- define "image-classifier.locustMaster" -}}
{{ include "image-classifier.fullname" . }}-locust-master
{{- end -}}

{{- define "image-classifier.modelPvc" -}}
{{- default (printf "%s-models" (include "image-classifier.fullname" .)) .Values.modelRepository.pvc.claimName -}}
{{- end -}}

{{/* What the repository is: Triton's --model-repository value. */}}
{{- define "image-classifier.modelRepository" -}}
{{- if .Values.modelRepository.s3.url -}}
{{- .Values.modelRepository.s3.url -}}
{{- else if eq .Values.mode "cpu-image" -}}
{{- /* the repository baked into our CPU image (deploy/image/Dockerfile) */ -}}
/models
{{- else -}}
{{- .Values.modelRepository.pvc.mountPath -}}
{{- end -}}
{{- end -}}

{{/*
Average time a client request waited in Triton's queues, summed over the steps of
its ensemble, over the window, in microseconds, per pod. An ensemble's own
nv_inference_queue_duration_us stays near zero (its composing models queue, not
it): the numerator sums the queue time of every model in the pod, the denominator
counts the requests of the model(s) clients call (`model`, a regex: several
entry points may share a pod). Triton's counters are cumulative: rate() of each
(delta() is for gauges and misreads a counter reset when a pod restarts); a floor
on the divisor makes an idle pod read 0. `matchers`: label selector text; `by`:
the grouping.
*/}}
{{- define "image-classifier.queueTimeQuery" -}}
sum(rate(nv_inference_queue_duration_us{ {{- .matchers -}} }[{{ .window }}])) by ({{ .by }}) / clamp_min(sum(rate(nv_inference_request_success{ {{- printf "%s,model=~%q" .matchers .model -}} }[{{ .window }}])) by ({{ .by }}), 1e-9)
{{- end -}}
