{{/* TEST DOUBLE: an operand's image as the real chart composes it: repository/image:version. */}}
{{- define "double.image" -}}
{{ .repository }}/{{ .image }}:{{ .version }}
{{- end -}}
