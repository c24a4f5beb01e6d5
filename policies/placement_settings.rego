# Settings of the shipped placement policy (deploy with placement.rego and
# placement_rules.rego; the chart fills them from its values).
package io.k8s.federation.settings

# How the clusters selected for a workload are weighted: "even" (every cluster
# weight 1, phase 1) or "least-loaded" (by free CPU; see placement.rego, rule 5).
weighting := "even"

# Whether a cluster's own report of its region counts: an Open Cluster
# Management ManagedCluster's claim region.open-cluster-management.io, which
# the managed cluster's administrator sets (a ClusterClaim its agent reports).
# false (the default): only what is set on the hub or control plane counts
# (labels, spec.region); the claim decides nothing. true: for a cluster whose
# jurisdiction label says neither "eu" nor "non-eu", the claimed region
# counts as its region.
trust_cluster_claims := false
