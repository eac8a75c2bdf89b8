//! colibrid: the long-lived daemon that keeps models warm and serves colibri.v1 over a
//! local socket.
//!
//! - [`transport`]: the Unix socket / named pipe, its permissions and peer checks.
//! - [`service`]: gRPC handlers (validate, route, wait; never compute).
//! - [`daemon`]: loaded models and their engine threads, sessions across models and disk.
//! - [`scheduler`]: the engine thread: batched steps over all live generations.
//! - [`snapshot`] and [`state`]: session snapshots and other persisted files.
//! - [`server`]: putting it together (health, reflection, signals, shutdown).
//! - [`http`]: the OpenAI/Anthropic-compatible HTTP API, a translation onto [`service`].

pub mod convert;
pub mod daemon;
pub mod http;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod state;
pub mod transport;
