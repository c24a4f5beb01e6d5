# Settings of the shipped placement policy (deploy with placement.rego and
# placement_rules.rego; the chart fills them from its values).
package io.k8s.federation.settings

# How the clusters selected for a workload are weighted: "even" (every cluster
# weight 1, phase 1) or "least-loaded" (by free CPU; see placement.rego, rule 5).
weighting := "even"
