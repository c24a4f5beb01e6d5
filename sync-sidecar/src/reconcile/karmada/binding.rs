//! A Karmada ResourceBinding or ClusterResourceBinding as the scheduler reads
//! it, and what scheduling writes into it: exactly what karmada-scheduler
//! writes (`pkg/scheduler/scheduler.go`): `spec.clusters`, the
//! `policy.karmada.io/applied-placement` annotation, the `Scheduled`
//! condition, `status.schedulerObservedGeneration` and
//! `status.lastScheduledTime`, and nothing else. Deciding is in [`decide`], the
//! writes in [`write`].

mod decide;
mod model;
mod write;

pub(crate) use self::decide::{Placement, placement};
pub(crate) use self::model::{Binding, Mode};
pub(crate) use self::write::{BindingWrite, plan};

#[cfg(test)]
mod tests;
