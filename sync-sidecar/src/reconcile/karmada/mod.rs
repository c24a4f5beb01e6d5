//! Karmada bindings: a ResourceBinding or ClusterResourceBinding whose
//! `spec.schedulerName` names this scheduler is placed where the policy
//! decides, within what the user's placement selects (karmada-scheduler
//! ignores it; Karmada's binding controller turns its `spec.clusters` into
//! Works); with the guardrail, every other binding's placement is kept
//! narrowed to the clusters the policy allows.

mod affinity;
pub(crate) mod binding;
pub(crate) mod division;
pub(crate) mod guard;
