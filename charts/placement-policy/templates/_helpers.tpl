{{/* Name prefix of every object of the release. */}}
{{- define "pp.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "pp.labels" -}}
app.kubernetes.io/name: placement-policy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "webhook"). */}}
{{- define "pp.selector" -}}
app.kubernetes.io/name: placement-policy
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image of the project: (dict "root" $ "name" "placement-webhook" "tag" ""). */}}
{{- define "pp.image" -}}
{{- $registry := .root.Values.image.registry -}}
{{- $tag := .tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if $registry -}}
{{ printf "%s/%s/%s:%s" $registry .root.Values.image.repository .name $tag }}
{{- else -}}
{{ printf "%s/%s:%s" .root.Values.image.repository .name $tag }}
{{- end -}}
{{- end -}}

{{- define "pp.webhookService" -}}
{{ include "pp.fullname" . }}-webhook
{{- end -}}

{{- define "pp.tlsSecret" -}}
{{ include "pp.fullname" . }}-webhook-tls
{{- end -}}

{{/* Namespaces never evaluated: the configured ones, the release's and the policy namespace. */}}
{{- define "pp.excludedNamespaces" -}}
{{- $all := concat (list .Release.Namespace .Values.policy.namespace) .Values.scope.excludedNamespaces | uniq -}}
{{- join "," $all -}}
{{- end -}}

{{/* Namespaces of Karmada's API server never evaluated: Karmada's own, the
policy namespace and the configured ones (the release namespace is this
cluster's). */}}
{{- define "pp.karmadaExcludedNamespaces" -}}
{{- $all := concat (list "karmada-system" "karmada-cluster" .Values.karmada.namespace .Values.policy.namespace) .Values.scope.excludedNamespaces | uniq -}}
{{- join "," $all -}}
{{- end -}}

{{/* Admission rules for the workload types in scope (`scope.resources`). */}}
{{- define "pp.scopeRules" -}}
{{- range .Values.scope.resources }}
{{- $parts := splitList "/" . }}
- apiGroups: [{{ if eq (len $parts) 3 }}{{ first $parts | quote }}{{ else }}""{{ end }}]
  apiVersions: [{{ index $parts (sub (len $parts) 2) | quote }}]
  resources: [{{ last $parts | quote }}, {{ printf "%s/status" (last $parts) | quote }}]
  operations: ["CREATE", "UPDATE"]
  scope: Namespaced
{{- end }}
{{- end -}}

{{/* RBAC rules for `[group/]version/resource` strings: (dict "types" list "verbs" list). */}}
{{- define "pp.rulesFor" -}}
{{- $verbs := .verbs -}}
{{- range .types }}
{{- $parts := splitList "/" . }}
{{- $group := "" }}
{{- $resource := last $parts }}
{{- if eq (len $parts) 3 }}{{ $group = first $parts }}{{ end }}
- apiGroups: [{{ $group | quote }}]
  resources: [{{ $resource | quote }}]
  verbs: {{ toJson $verbs }}
{{- end }}
{{- end -}}

{{/* Security settings of every pod and container. */}}
{{- define "pp.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "pp.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The OPA container beside a placement-sync sidecar. */}}
{{- define "pp.opaContainer" -}}
- name: opa
  image: {{ include "pp.image" (dict "root" . "name" .Values.engine.opa.image "tag" .Values.engine.opa.tag) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - run
    - --server
    # Only the pod's own containers reach the API.
    - --addr=127.0.0.1:8181
    # Health and metrics only, for the kubelet's probes and scrapers.
    - --diagnostic-addr=0.0.0.0:8282
    - --skip-version-check
    - --log-level=error
  ports:
    - {name: opa-diag, containerPort: 8282}
  # On termination every container gets SIGTERM at once, but the webhook
  # keeps answering for its --shutdown-delay and then finishes what is in
  # flight: OPA must outlive it, or those reviews find no engine.
  lifecycle:
    preStop:
      sleep:
        seconds: 15
  # No readiness probe: a pod's readiness is the webhook's alone. An OPA that
  # hangs or lost its policies makes the webhook fail closed iff policies
  # exist; gating the pod on it would drop the Service's endpoints and deny
  # every write, with or without policies. A hung OPA is restarted.
  livenessProbe:
    httpGet: {path: /health, port: opa-diag}
    periodSeconds: 10
    failureThreshold: 6
  resources: {{- toYaml .Values.engine.opa.resources | nindent 4 }}
  securityContext: {{- include "pp.containerSecurity" . | nindent 4 }}
{{- end -}}

{{/* Which ConfigMaps are policies and data: the same flags for the webhook and placement-sync. */}}
{{- define "pp.policySelection" -}}
- --policy-namespace={{ .Values.policy.namespace }}
{{- with .Values.policy.namespaces }}
- --namespaces={{ join "," . }}
{{- end }}
- --policy-label={{ .Values.policy.label }}
- --policy-value={{ .Values.policy.value }}
- --data-label={{ .Values.policy.dataLabel }}
- --data-value={{ .Values.policy.dataValue }}
{{- end -}}

{{/* Flags of placement-sync shared by its two roles. */}}
{{- define "pp.syncArgs" -}}
- --opa-url=http://127.0.0.1:8181
{{ include "pp.policySelection" . }}
- --decision={{ .Values.policy.decision }}
{{- with .Values.policy.ownerNamespaces }}
- --package-owner-namespaces={{ join "," . }}
{{- end }}
{{- with .Values.policy.ownedPackages }}
- --owned-packages={{ join "," . }}
{{- end }}
{{- range .Values.sync.replicate }}
- --replicate={{ . }}
{{- end }}
{{- range .Values.sync.replicateCluster }}
- --replicate-cluster={{ . }}
{{- end }}
{{- if .Values.sync.replicateOnlyReadTypes }}
- --replicate-only-read-types
{{- end }}
- --last-good-policies={{ .Release.Namespace }}/{{ include "pp.fullname" . }}-last-good-policies
- --listen=0.0.0.0:8182
{{- end -}}

{{- define "pp.scheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A Kubernetes label selector ({matchLabels, matchExpressions}) as the string of `kubectl -l`. */}}
{{- define "pp.labelSelector" -}}
{{- $terms := list -}}
{{- range $key, $value := (.matchLabels | default dict) -}}
{{- $terms = append $terms (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- range (.matchExpressions | default list) -}}
{{- if eq .operator "In" -}}
{{- $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $terms = append $terms .key -}}
{{- else if eq .operator "DoesNotExist" -}}
{{- $terms = append $terms (printf "!%s" .key) -}}
{{- else -}}
{{- fail (printf "unknown label selector operator %q" .operator) -}}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{/*
The shipped policy's modules (policies/*.rego but the tests) as ConfigMap
data, with the settings module's weighting from policy.weighting and its
trust in clusters' own claims from policy.trustClusterClaims.
*/}}
{{- define "pp.shippedPolicy" -}}
{{- $weighting := .Values.policy.weighting | default "even" -}}
{{- if not (has $weighting (list "even" "least-loaded")) -}}
{{- fail (printf "policy.weighting must be even or least-loaded, got %q" $weighting) -}}
{{- end -}}
{{- range $path, $_ := .Files.Glob "policies/*.rego" }}
{{- if not (hasSuffix "_test.rego" $path) }}
{{ base $path }}: |
  {{- $source := $.Files.Get $path }}
  {{- if eq (base $path) "placement_settings.rego" }}
  {{- $source = replace "weighting := \"even\"" (printf "weighting := %q" $weighting) $source }}
  {{- if $.Values.policy.trustClusterClaims }}
  {{- $source = replace "trust_cluster_claims := false" "trust_cluster_claims := true" $source }}
  {{- end }}
  {{- end }}
  {{- $source | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
API access, for the containers that call the API server only: the pods do not
automount their service account's token (every container would get it, OPA
too); this volume holds what the automount would (a bound, short-lived token
the kubelet renews, the cluster's CA and the namespace), at the path client
libraries look for it.
*/}}
{{- define "pp.apiAccessVolume" -}}
- name: kube-api-access
  projected:
    defaultMode: 292 # 0444: readable, not writable
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - {key: ca.crt, path: ca.crt}
      - downwardAPI:
          items:
            - path: namespace
              fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}
{{- end -}}

{{- define "pp.apiAccessMount" -}}
- {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- end -}}
