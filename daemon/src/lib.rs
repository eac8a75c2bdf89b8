//! colibrid: the long-lived daemon that keeps models warm and serves colibri.v1 over a
//! local socket.
//!
//! - [`authority`]: lets gRPC C-core clients' socket-path `:authority` through h2.
//! - [`transport`]: the Unix socket / named pipe, its permissions and peer checks.
//! - [`service`]: gRPC handlers (validate, route, wait; never compute).
//! - [`limits`]: what one request may cost; the checks shared by every front door.
//! - [`metrics`]: the counters `/metrics` reports (requests, generations, time to first token).
//! - [`memory`]: allocator settings and trimming, so RSS returns after large requests.
//! - [`daemon`]: loaded models and their engine threads, sessions across models and disk.
//! - [`scheduler`]: the engine thread: batched steps over all live generations.
//! - [`activity`]: which experts each model routes to (the dashboard's grid reads it).
//! - [`prefix`]: the prefix cache (KV of earlier requests reused by later ones).
//! - [`snapshot`] and [`state`]: session snapshots and other persisted files.
//! - [`wire`]: the proto mapping (colibri.v1 fields ↔ engine types, engine errors → gRPC codes).
//! - [`server`]: putting it together (health, reflection, signals, shutdown).
//! - [`serving`]: the HTTP listener's settings and handle, as the daemon keeps them.
//! - [`http`]: the OpenAI/Anthropic-compatible HTTP API, a translation onto [`service`].

pub mod activity;
pub mod authority;
pub mod daemon;
pub mod http;
pub mod limits;
pub mod memory;
pub mod metrics;
pub mod pacer;
pub mod prefix;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod serving;
pub mod snapshot;
pub mod state;
pub mod transport;
pub mod wire;
