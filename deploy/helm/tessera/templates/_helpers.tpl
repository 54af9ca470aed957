{{/*
Names, labels and the image, as Helm's own `helm create` scaffold has them, so the
chart behaves as operators expect (nameOverride, fullnameOverride, standard labels).
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object's name: fullnameOverride, else the release name when it
already contains the chart's name (`helm install tessera ...` gives tessera-node, not
tessera-tessera-node), else release-name.
*/}}
{{- define "tessera.fullname" -}}
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

{{- define "tessera.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What selects a release's pods; never changes across upgrades. */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ include "tessera.chart" . }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- end }}

{{/* registry/repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "tessera.image" -}}
{{- $repo := .Values.image.repository }}
{{- with .Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/*
Refuses the `default` namespace: the webhook skips its own namespace, so installing
there would exempt every pod of `default` from Tessera. Override with
allowDefaultNamespace=true if that is really what you want.
*/}}
{{- define "tessera.namespaceGuard" -}}
{{- if and (eq .Release.Namespace "default") (not .Values.allowDefaultNamespace) }}
{{- fail "tessera: refusing to install into the `default` namespace (the webhook skips its own namespace, so every pod there would run without the shim); use --namespace tessera-system --create-namespace, or set allowDefaultNamespace=true" }}
{{- end }}
{{- end }}
