//! What the daemon keeps of its HTTP listener: how it is set up ([`HttpConfig`], from the
//! `--http-*` flags or a ServeHttp request) and the running listener ([`Serving`]). The
//! listener itself is in [`crate::http`].

use std::net::SocketAddr;
use std::time::Duration;

/// How the listener is set up (`colibrid --http ...` flags, or a ServeHttp request).
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// host:port as given (a name such as `localhost` is resolved when binding).
    pub address: String,
    /// Clients must send it (Bearer or x-api-key); required for a non-loopback address.
    pub api_key: Option<String>,
    /// Host header values accepted besides loopback names and IP literals; "*" = any.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed to call the API from a browser (CORS); empty = none, "*" = any.
    pub cors_origins: Vec<String>,
    /// Largest request body, bytes (larger: 413).
    pub body_limit: usize,
    /// A streamed answer sends a keep-alive (`ping` event / SSE comment) after this long
    /// without another event, e.g. while a long prompt is prefilled.
    pub ping_every: Duration,
}

impl HttpConfig {
    pub fn new(address: impl Into<String>) -> HttpConfig {
        HttpConfig {
            address: address.into(),
            api_key: None,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            ping_every: Duration::from_secs(5),
        }
    }
}

pub const DEFAULT_BODY_LIMIT: usize = 32 << 20;
pub const DEFAULT_PORT: u16 = 11435;

/// A running listener.
pub struct Serving {
    pub url: String,
    pub addr: SocketAddr,
    pub(crate) stop: tokio::sync::watch::Sender<bool>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// Stops accepting, lets running requests end (their generations are being cancelled
    /// by the unload that precedes this), waits at most `grace`.
    pub async fn stop(self, grace: Duration) {
        self.stop.send_replace(true);
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            tracing::warn!("HTTP clients still connected after {grace:?}; closing anyway");
            task.abort();
        }
    }
}
