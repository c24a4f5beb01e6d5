# A rule of the benchmark's own, loaded beside the shipped policy by
# contenders (b2) and (c2) of scenario 1: it reads the workload's app label,
# which differs between all workloads of the varied stream, so no two of its
# reviews share a remembered decision and every one is evaluated (embedded)
# or asked of OPA (with OPA), as under any policy that reads what differs
# between objects (a team label, the name, an image). No workload of the
# stream has a retired app, so the answers are the shipped policy's.
package io.k8s.federation.placement

# Apps that were retired may not be placed again.
errors contains msg if {
	some app in {"legacy-billing", "legacy-ledger"}
	input.metadata.labels.app == app
	msg := sprintf("app %q is retired", [app])
}
