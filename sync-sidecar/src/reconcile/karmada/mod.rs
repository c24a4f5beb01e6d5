//! Scheduling Karmada bindings: a ResourceBinding or ClusterResourceBinding
//! whose `spec.schedulerName` names this scheduler is placed where the policy
//! decides (karmada-scheduler ignores it; Karmada's binding controller turns
//! its `spec.clusters` into Works).

pub(crate) mod binding;
pub(crate) mod division;
