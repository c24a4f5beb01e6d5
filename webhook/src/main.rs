use std::process::ExitCode;

use clap::Parser;
use placement_webhook::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // One crypto provider for the whole process (rustls, reqwest, kube).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => placement_webhook::serve(*args)
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Review(args) => placement_webhook::review(args).await.map(|summary| {
                // Denials exit 3 so scripts and CI can gate on the policy.
                if summary.denied > 0 {
                    ExitCode::from(3)
                } else {
                    ExitCode::SUCCESS
                }
            }),
            Command::Certs(args) => placement_webhook::certs(args).map(|()| ExitCode::SUCCESS),
        }
        .map_err(anyhow::Error::from)
    })
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, not in a pod's log.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
