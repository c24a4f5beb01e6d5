//! The end-to-end tests on a real Open Cluster Management hub and its
//! managed clusters (built from `../shared/peers/ocm`): the bed and the
//! Placements placement-policy decides (`ocm`), and the last hop of delivery
//! (its `delivery` module). One binary for the hub
//! ([`placement_tests::Ocm::shared`]); the tests run one at a time
//! ([`placement_tests::serial`]).
//!
//! Every test's path contains `ocm_`: `scripts/test` skips them by that name
//! where OCM's source is absent. No test of another binary contains it.

#[path = "../e2e/ocm/mod.rs"]
mod ocm;
