//! Listeners that no client can hold: open connections are capped in total
//! and per peer (an address, an IPv6 prefix: [`Peers`]), and shared fairly
//! (a peer holding fewer connections takes an idle one of the largest holder
//! when every slot is taken; verified clients and the pod's own keep to no
//! share); a connection is idle only past its opening (its TLS handshake and
//! first request); a few more slots are kept beyond the others, where a
//! connection that found none completes its TLS handshake (a verified one
//! then takes a slot: trust belongs to a connection, never to its address)
//! and is answered one probe, so that probes are answered whatever others
//! hold; the TLS handshake, request heads and idle time are clocked;
//! connections are retired after a maximum age; HTTP/2 streams are capped;
//! accept errors are survived, logged and counted. Both binaries serve every
//! listener of theirs through [`serve`].

mod connections;
mod metrics;
mod signal;
mod slots;
mod throttle;

pub use connections::{
    ClientCertificate, ConnectionLimits, Listener, Stopping, TlsSettings, connection_cap, serve,
};
pub use metrics::ListenerMetrics;
pub use signal::shutdown_signal;
pub use slots::Peers;
pub use throttle::Throttle;
