use std::process::ExitCode;

use clap::Parser;
use kubectl_placement::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One crypto provider for the whole process (kube, reqwest).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            runtime
                .block_on(kubectl_placement::run(cli))
                .map_err(anyhow::Error::from)
        });
    match result {
        Ok(code) => ExitCode::from(code),
        // As kubectl says it: one line, with its causes; no backtrace.
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
