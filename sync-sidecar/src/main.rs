use clap::Parser;
use placement_sync::{Args, Settings, SyncError};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One crypto provider in the tree (ring); install it before any TLS use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    // RUST_LOG, when set, wins over --log-level. Colours only for a person at
    // a terminal, not in a pod's log.
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new(args.log_level.trim())),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let settings = Settings::from_args(args).map_err(|e| match e {
        SyncError::Config(message) => {
            anyhow::anyhow!(
                "invalid configuration: {message} (placement-sync --help lists every flag)"
            )
        }
        other => anyhow::Error::from(other).context("invalid configuration"),
    })?;
    let cancel = CancellationToken::new();
    tokio::spawn({
        let cancel = cancel.clone();
        async move {
            placement_endpoint::shutdown_signal().await;
            tracing::info!("shutting down");
            cancel.cancel();
        }
    });
    placement_sync::run(settings, cancel).await?;
    Ok(())
}
