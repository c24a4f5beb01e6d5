# OPA answering the AdmissionReview itself (contender (d) of benchmark scenario 1).
#
# OPA's Kubernetes admission mode: `opa run --server --tls-cert-file ... ` with
# this module; the API server (here: the load generator) POSTs the AdmissionReview
# to `/`, OPA's default decision `data.system.main`, and gets back the
# AdmissionReview response. The decision comes from the shipped policy
# (`data.io.k8s.federation.admission`, evaluated with the object as input and the
# request's metadata under `_admission`, as placement-webhook asks it), and the
# response carries the same RFC 6902 patch that placement-webhook sends: the
# policy's annotations (non-string values serialized compactly) plus the
# ownership record `placement-policy.io/policy-owned`, signed as placement-webhook
# signs it (HMAC-SHA256 with the key at `data.bench.ownership_key`, over the
# object's API group, kind, namespace and name, the time and the record; the
# tag in hex).
#
# Scope: a fresh object (a CREATE, which the benchmark sends). Unlike
# placement-webhook it does not restore the developer's view from an existing
# ownership record, validate annotation keys, or check the 256 KiB limit; those
# cost placement-webhook a little more, not less.
package system

req := input.request

main := {
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"response": response,
}

policy_input := object.union(req.object, {"_admission": {
	"uid": req.uid,
	"operation": req.operation,
	"kind": req.kind,
	"resource": req.resource,
	"namespace": object.get(req, "namespace", null),
	"name": object.get(req, "name", null),
	"userInfo": object.get(req, "userInfo", {}),
	"dryRun": object.get(req, "dryRun", false),
}})

decision := d if {
	d := data.io.k8s.federation.admission with input as policy_input
}

denied if count(decision.errors) > 0

response := {"uid": req.uid, "allowed": false, "status": {
	"code": 403,
	"reason": "Forbidden",
	"message": sprintf("placement policy denied the request: %s", [concat("; ", decision.errors)]),
}} if denied

response := {
	"uid": req.uid,
	"allowed": true,
	"patchType": "JSONPatch",
	"patch": base64.encode(json.marshal(patch)),
} if {
	not denied
	count(patch) > 0
}

response := {"uid": req.uid, "allowed": true} if {
	not denied
	count(patch) == 0
}

# --- The annotations the object should carry ---------------------------------

owned_key := "placement-policy.io/policy-owned"

has_annotations if is_object(req.object.metadata.annotations)

current := object.get(req.object, ["metadata", "annotations"], {})

stringify(v) := v if is_string(v)

stringify(v) := json.marshal(v) if not is_string(v)

policy_values[k] := stringify(v) if some k, v in decision.annotations

# Keys whose policy value differs from the developer's: the policy owns them.
owned_keys := sort([k | some k, v in policy_values; object.get(current, k, null) != v])

# Serialized exactly as placement-webhook does (field order written, requested).
owned_record := concat("", ["{", concat(",", [entry |
	some k in owned_keys
	entry := sprintf(`%s:{"written":%s,"requested":%s}`, [
		json.marshal(k),
		json.marshal(sprintf("sha256:%s", [crypto.sha256(policy_values[k])])),
		json.marshal(object.get(current, k, null)),
	])
]), "}"])

# The object the record belongs to, as placement-webhook binds a record made
# while the object is being created (it has no uid yet): API group, kind,
# namespace, name (or generateName) and the time the record is made, in Unix
# seconds.
record_name := n if {
	n := object.get(req.object, ["metadata", "generateName"], "")
	n != ""
} else := object.get(req.object, ["metadata", "name"], "")

record_group := parts[0] if {
	parts := split(object.get(req.object, "apiVersion", ""), "/")
	count(parts) == 2
} else := ""

creating := format_int(floor(time.now_ns() / 1000000000), 10)

record_message := concat("\n", [
	"creating",
	record_group,
	object.get(req.object, "kind", ""),
	object.get(req.object, ["metadata", "namespace"], ""),
	record_name,
	creating,
	owned_record,
])

# The tag in hex: OPA's strings hold text, not bytes, so the tag cannot be
# re-encoded as placement-webhook's unpadded base64 without a costly detour in
# Rego; the bench compares the two tags after decoding. The key (the bench
# writes one whose bytes are ASCII) is decoded to a string.
record_mac := concat("", ["hmac-sha256-hex:", crypto.hmac.sha256(record_message, base64.decode(data.bench.ownership_key))])

ownership_record := sprintf(`{"owned":%s,"creating":%s,"mac":%s}`, [owned_record, creating, json.marshal(record_mac)])

ownership := {owned_key: ownership_record} if count(owned_keys) > 0

ownership := {} if count(owned_keys) == 0

desired := object.union(object.union(object.remove(current, [owned_key]), policy_values), ownership)

# --- The minimal patch ------------------------------------------------------

pointer(k) := concat("/", ["", "metadata", "annotations", replace(replace(k, "~", "~0"), "/", "~1")])

patch := [{"op": "add", "path": "/metadata/annotations", "value": desired}] if {
	not has_annotations
	count(desired) > 0
}

patch := [] if {
	not has_annotations
	count(desired) == 0
}

patch := array.concat(removes, changes) if has_annotations

removes := [{"op": "remove", "path": pointer(k)} |
	some k in sort(object.keys(current))
	not k in object.keys(desired)
]

changes := [change(k) |
	some k in sort(object.keys(desired))
	object.get(current, k, null) != desired[k]
]

change(k) := {"op": "add", "path": pointer(k), "value": desired[k]} if not k in object.keys(current)

change(k) := {"op": "replace", "path": pointer(k), "value": desired[k]} if k in object.keys(current)
