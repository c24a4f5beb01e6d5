use std::process::ExitCode;

use clap::Parser;
use kubectl_placement::Cli;

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // One crypto provider for the whole process (kube, reqwest).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(kubectl_placement::run(cli))?;
    Ok(ExitCode::from(code))
}
