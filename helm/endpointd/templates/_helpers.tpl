{{- define "endpointd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "endpointd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "endpointd.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "endpointd.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "endpointd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "endpointd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "endpointd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "endpointd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "endpointd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The conntrack settings given, as `endpointd run` flags, one per line (none: empty). */}}
{{- define "endpointd.conntrackFlags" -}}
{{- with .Values.conntrack -}}
{{- if .maxPerCore }}
--conntrack-max-per-core={{ int64 .maxPerCore }}
{{- end }}
{{- if .min }}
--conntrack-min={{ int64 .min }}
{{- end }}
{{- with .tcpTimeoutEstablished }}
--conntrack-tcp-timeout-established={{ . }}
{{- end }}
{{- with .tcpTimeoutCloseWait }}
--conntrack-tcp-timeout-close-wait={{ . }}
{{- end }}
{{- if .tcpBeLiberal }}
--conntrack-tcp-be-liberal=true
{{- end }}
{{- with .udpTimeout }}
--conntrack-udp-timeout={{ . }}
{{- end }}
{{- with .udpTimeoutStream }}
--conntrack-udp-timeout-stream={{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The port of an ADDR:PORT (IPv6 in brackets). */}}
{{- define "endpointd.port" -}}
{{- splitList ":" . | last -}}
{{- end -}}

{{/* The host of an ADDR:PORT, without brackets. */}}
{{- define "endpointd.host" -}}
{{- $port := splitList ":" . | last -}}
{{- trimSuffix (printf ":%s" $port) . | trimPrefix "[" | trimSuffix "]" -}}
{{- end -}}

{{- define "endpointd.drainSocket" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.drain.socketDir) .Values.drain.socketName -}}
{{- end -}}

{{/* "true" when the host of an ADDR:PORT is a loopback address, else empty. */}}
{{- define "endpointd.loopback" -}}
{{- $h := include "endpointd.host" . -}}
{{- if or (hasPrefix "127." $h) (eq $h "::1") (eq $h "localhost") -}}true{{- end -}}
{{- end -}}

{{/* How agents authenticate each other: identity, peerTLS or insecure (drain.peerTLS.insecure wins). */}}
{{- define "endpointd.peerAuth" -}}
{{- if .Values.drain.peerTLS.insecure -}}insecure{{- else -}}{{ .Values.drain.peerAuth }}{{- end -}}
{{- end -}}

{{/* The peer port's server certificate Secret under identity. */}}
{{- define "endpointd.peerServerSecret" -}}
{{- .Values.drain.peerIdentity.serverSecretName | default (printf "%s-peer-server" (include "endpointd.fullname" .)) -}}
{{- end -}}
