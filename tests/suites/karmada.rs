//! The end-to-end tests on a real Karmada federation (built from
//! `../shared/peers/karmada`): the bed itself (`karmada`), and the
//! placements Karmada users write in both of placement-policy's modes with
//! the last hop of delivery (`karmada_composition`, its `delivery` module).
//! One binary, so the harness links once and one federation
//! ([`placement_tests::Karmada::shared`]) serves every test; the tests run
//! one at a time ([`placement_tests::serial`]).
//!
//! Every test's path contains `karmada_`: `scripts/test` skips them by that
//! name where Karmada's source is absent. No test of another binary
//! contains it. OCM has a binary of its own, so the two federations (each
//! taking 2-3 GiB) never run in one process at once.

#[path = "../e2e/karmada/mod.rs"]
mod karmada;
#[path = "../e2e/karmada_composition/mod.rs"]
mod karmada_composition;
