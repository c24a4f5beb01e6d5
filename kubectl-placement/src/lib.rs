//! `kubectl placement`: the operator's view of placement-policy at the kubectl
//! prompt.
//!
//! - `explain KIND/NAME` evaluates the policy set in force, with the data the
//!   engines hold, on the embedded engine, here: per cluster, whether the
//!   object may run there and the policy's reason (`reasons` and
//!   `exclusions` of the shipped rules package);
//! - `status` says whether the policy set is loaded and in force, what the
//!   last good set is, and whether each engine is in sync;
//! - `held` lists the changes the blast-radius guard holds, with what they
//!   would move, and `confirm ID` lets one through.
//!
//! Everything is read from the API server as placement-sync leaves it (status
//! annotations, the last good set, held reports) or, offline, from files.

mod cli;
mod error;
mod explain;
mod held;
mod keys;
mod policy_set;
mod resources;
mod status;
mod table;

pub use cli::{Cli, Command};
pub use error::PluginError;

/// Run one command; the exit status on success (`explain`: 3 when the
/// object may run nowhere, as `placement-webhook review` exits on a denial).
pub async fn run(cli: Cli) -> Result<u8, PluginError> {
    match cli.command {
        Command::Explain(args) => explain::explain(&cli.global, *args).await,
        Command::Status(args) => status::status(&cli.global, args).await,
        Command::Held(args) => held::held(&cli.global, args).await,
        Command::Confirm(args) => held::confirm(&cli.global, args).await,
    }
}
