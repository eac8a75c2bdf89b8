//! `colibrid` itself: arguments, the listening endpoint, the gRPC server with health and
//! reflection, keep-alive, and an orderly shutdown on SIGTERM/SIGINT or the Shutdown RPC
//! (finish the current step, snapshot sessions, save pins, remove the socket, exit 0).

use crate::daemon::{Config, Daemon};
use crate::scheduler::EngineConfig;
use crate::service::Service;
use crate::state::{self, StateDir};
use crate::transport;
use clap::Parser;
use colibri_proto::v1 as pb;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "colibrid",
    version,
    about = "colibri daemon: keeps models and their expert caches warm, serves colibri.v1 gRPC on a local socket"
)]
pub struct Args {
    /// Socket to listen on [default: $XDG_RUNTIME_DIR/colibri/colibrid.sock, else
    /// ~/.colibri/run/colibrid.sock; a named pipe on Windows].
    #[arg(long, env = "COLI_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Where sessions, pins and logs are kept [default: $XDG_STATE_HOME/colibri, else
    /// ~/.local/state/colibri].
    #[arg(long, env = "COLIBRI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Unload a model after this many idle seconds (0 = never).
    #[arg(long, default_value_t = 0)]
    pub keep_alive: u64,
    /// Generations stepped together per model at most.
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// Requests per model that may wait beyond --max-batch before RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Prompt tokens fed per step while other sessions are decoding, at most.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// While other sessions are decoding, a step that also feeds a prompt may take this many
    /// times a decode-only step: the prompt chunk is sized from measured step times, so a
    /// long prompt never stalls running sessions for long (0 = always --prefill-chunk).
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    pub prefill_pace: f64,
    /// Prompt tokens fed per step when nothing else is decoding.
    #[arg(long, default_value_t = 512)]
    pub solo_prefill_chunk: usize,
    /// Serve routed experts from the budgeted expert cache (read from disk on demand,
    /// prefetched, usage remembered across starts) instead of the memory map.
    #[arg(long)]
    pub stream: bool,
    /// Expert cache budget in MiB (implies --stream) [default: the memory plan's].
    #[arg(long, value_name = "MIB")]
    pub expert_cache: Option<u64>,
    /// Snapshot a session to disk after it has been idle this many seconds.
    #[arg(long, default_value_t = 30.0)]
    pub session_save_after: f64,
    /// Memory per model for the prefix cache (KV of earlier requests reused by later ones
    /// that start with the same tokens), MiB; 0 = off.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub prefix_cache: u64,
    /// Which prefix-cache entry is dropped first: lfu (fewest uses per time since last
    /// use; measured best on a chat + agent mix, daemon/examples/prefix_policy.rs), lru or
    /// largest.
    #[arg(long, default_value = "lfu", value_parser = ["lru", "lfu", "largest"])]
    pub prefix_cache_policy: String,
    /// Also serve the OpenAI- and Anthropic-compatible HTTP API on HOST:PORT, e.g.
    /// 127.0.0.1:11435 (docs/http.md). A non-loopback address needs --api-key.
    #[arg(long, value_name = "HOST:PORT", help_heading = "HTTP API")]
    pub http: Option<String>,
    /// The key HTTP clients must send (Authorization: Bearer KEY, or x-api-key: KEY).
    #[arg(
        long,
        env = "COLIBRI_API_KEY",
        hide_env_values = true,
        help_heading = "HTTP API"
    )]
    pub api_key: Option<String>,
    /// Host header names the HTTP API answers besides IP addresses and localhost (against
    /// DNS rebinding); repeat it, or "*" for any.
    #[arg(
        long = "http-allow-host",
        value_name = "NAME",
        help_heading = "HTTP API"
    )]
    pub http_allow_hosts: Vec<String>,
    /// Browser origins allowed to call the HTTP API (CORS), e.g. http://localhost:3000;
    /// repeat it, or "*" for any. None by default.
    #[arg(
        long = "http-cors-origin",
        value_name = "ORIGIN",
        help_heading = "HTTP API"
    )]
    pub http_cors_origins: Vec<String>,
    /// Largest HTTP request body in bytes (larger ones get 413).
    #[arg(long, default_value_t = crate::serving::DEFAULT_BODY_LIMIT, value_name = "BYTES", help_heading = "HTTP API")]
    pub http_body_limit: usize,
    /// Seconds without an event after which a streamed answer sends a keep-alive (ping),
    /// e.g. while a long prompt is prefilled.
    #[arg(
        long,
        default_value_t = 5.0,
        value_name = "SECS",
        help_heading = "HTTP API"
    )]
    pub http_ping: f64,
}

pub fn main() -> ExitCode {
    let memory = crate::memory::Policy::from_env();
    crate::memory::configure(memory);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COLIBRID_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match run(args, memory) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("colibrid: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn run(args: Args, memory: crate::memory::Policy) -> anyhow::Result<()> {
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(transport::default_socket_path);
    let state_root = args
        .state_dir
        .clone()
        .unwrap_or_else(state::default_state_dir);
    // Bind before anything else runs: a second daemon must fail here, fast and clearly, and
    // before it opens the state folder (whose opening clears interrupted writes: the running
    // daemon's writes in flight must not be taken for those).
    let endpoint = transport::bind(&socket)?;
    let state = match StateDir::open(state_root.clone()) {
        Ok(s) => s,
        Err(e) => {
            endpoint.cleanup();
            anyhow::bail!("state directory {}: {e}", state_root.display());
        }
    };
    let cfg = Config {
        socket: endpoint.path.clone(),
        state_dir: state.root.clone(),
        keep_alive: (args.keep_alive > 0).then(|| Duration::from_secs(args.keep_alive)),
        engine: EngineConfig {
            max_batch: args.max_batch.max(1),
            prefill_chunk: args.prefill_chunk.max(1),
            prefill_pace: args.prefill_pace,
            solo_prefill_chunk: args.solo_prefill_chunk.max(1),
            session_save_after: Duration::from_secs_f64(args.session_save_after.max(0.0)),
            prefix_cache_bytes: (args.prefix_cache as usize) << 20,
            prefix_cache_policy: crate::prefix::Policy::parse(&args.prefix_cache_policy)
                .unwrap_or(crate::prefix::Policy::Lfu),
        },
        queue: args.queue,
        stream: args.stream || args.expert_cache.is_some(),
        expert_cache: args.expert_cache.map(|mib| mib << 20),
        http: crate::serving::HttpConfig {
            address: args.http.clone().unwrap_or_default(),
            api_key: args.api_key.clone().filter(|k| !k.is_empty()),
            allowed_hosts: args.http_allow_hosts.clone(),
            cors_origins: args.http_cors_origins.clone(),
            body_limit: args.http_body_limit,
            ping_every: Duration::from_secs_f64(if args.http_ping.is_finite() {
                args.http_ping.clamp(0.001, 3600.0)
            } else {
                5.0
            }),
        },
    };
    let daemon = Daemon::new(cfg, state);
    // Read every snapshot's header once: damaged ones are reported and set aside now.
    let sessions = daemon.all_sessions();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("colibrid-rpc")
        .build()?;
    rt.spawn(crate::memory::watch(memory));
    let result = rt.block_on(serve(Arc::clone(&daemon), &endpoint, sessions.len()));
    endpoint.cleanup();
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

async fn serve(
    daemon: Arc<Daemon>,
    endpoint: &transport::Endpoint,
    sessions: usize,
) -> anyhow::Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::colibri_server::ColibriServer<Service>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let colibri = pb::colibri_server::ColibriServer::new(Service {
        daemon: Arc::clone(&daemon),
        serve_http: crate::http::serve_http_rpc,
    })
    // Requests may carry long prompts; Score answers carry positions × vocab logits. Both
    // are bounded (crate::limits, docs/daemon.md).
    .max_decoding_message_size(crate::limits::MAX_REQUEST_BYTES)
    .max_encoding_message_size(crate::limits::MAX_RESPONSE_BYTES);

    #[cfg(unix)]
    let incoming = transport::incoming(endpoint.listener.try_clone()?)?;
    #[cfg(windows)]
    let incoming = transport::incoming(endpoint)?;

    // The HTTP API first: a bad --http fails the start, before anything is served.
    if !daemon.cfg.http.address.is_empty() {
        crate::http::ensure_serving(&daemon, daemon.cfg.http.clone()).await?;
    }

    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(colibri)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = server_stopped.await;
            }),
    );
    tracing::info!(
        "colibrid {} listening on {} (state in {}, {sessions} saved sessions)",
        env!("CARGO_PKG_VERSION"),
        endpoint.path.display(),
        daemon.state.root.display()
    );

    // Always: a model's own keep-alive (set from the dashboard) may apply without the
    // daemon's --keep-alive.
    {
        let d = Arc::clone(&daemon);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                d.keep_alive_tick().await;
            }
        });
    }

    let why = wait_for_stop(&daemon, endpoint).await;
    tracing::info!("{why}: finishing current steps and saving state");
    health
        .set_not_serving::<pb::colibri_server::ColibriServer<Service>>()
        .await;
    daemon.unload_all().await;
    if let Some(http) = daemon.http.lock().await.take() {
        http.stop(Duration::from_secs(5)).await;
    }
    let _ = stop_server.send(());
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!("server: {e}"),
        Ok(Err(e)) => tracing::warn!("server task: {e}"),
        Err(_) => tracing::warn!("clients still connected after 5 s; closing anyway"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGTERM, SIGINT, a Shutdown RPC, or the socket file disappearing; says which.
async fn wait_for_stop(daemon: &Daemon, endpoint: &transport::Endpoint) -> &'static str {
    let mut shutdown = daemon.shutdown.subscribe();
    let rpc = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    // A daemon whose socket was deleted (its folder removed) is unreachable for ever.
    let orphaned = async {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if endpoint.socket_gone() {
                break;
            }
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = rpc => "shutdown request",
            _ = orphaned => "socket file removed",
        }
    }
    #[cfg(not(unix))]
    {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => "Ctrl-C",
            _ = rpc => "shutdown request",
            _ = orphaned => "socket file removed",
        }
    }
}
