//! `coli serve`: loads models into colibrid (starting it if needed) and makes sure it serves
//! the OpenAI/Anthropic-compatible HTTP API, then prints the API's base URL.

use crate::args::Global;
use crate::daemon_discovery::{self, RpcResult};
use crate::manage::parse_size;
use crate::output::{print_json, OutputFormat};
use crate::remote::{load_model_reporting, model_id};
use clap::Args;
use colibri_proto::v1 as pb;
use serde_json::json;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model folder to load and serve (repeat it for several).
    #[arg(long, value_name = "DIR", required = true)]
    pub model: Vec<PathBuf>,
    /// Where the HTTP API listens. A non-loopback address needs an API key.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:11435")]
    pub http: String,
    /// The key clients must send (Authorization: Bearer KEY, or x-api-key) [default: the
    /// daemon's own, if it has one].
    #[arg(long, env = "COLIBRI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Expert cache budget of the models loaded now, e.g. 8G [default: the daemon's].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub expert_cache: Option<u64>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn serve(global: &Global, args: ServeArgs) -> anyhow::Result<()> {
    let ids = args
        .model
        .iter()
        .map(|m| model_id(m))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let r = daemon_discovery::runtime()?.block_on(async {
        let mut c = daemon_discovery::ensure(global).await?;
        for id in &ids {
            load_model_reporting(&mut c, id, args.expert_cache, true).await?;
        }
        c.serve_http(pb::ServeHttpRequest {
            address: args.http.clone(),
            api_key: args.api_key.clone().unwrap_or_default(),
        })
        .await
        .rpc()
    })?;
    let ours: Vec<&pb::HttpModel> = r.models.iter().filter(|m| ids.contains(&m.id)).collect();
    if args.output == OutputFormat::Json {
        return print_json(&json!({
            "url": r.url,
            "started": r.started,
            "models": r.models.iter().map(|m| json!({"name": m.name, "id": m.id})).collect::<Vec<_>>(),
        }));
    }
    println!("{}", r.url);
    for m in &ours {
        println!("serving \"{}\" ({})", m.name, m.id);
    }
    if !r.started && !r.url.contains(&args.http) {
        eprintln!(
            "note: the daemon already served the API at {} (started earlier); `coli stop` and run \
             this again to listen on {} instead",
            r.url, args.http
        );
    }
    let root = r.url.trim_end_matches("/v1");
    let example = ours.first().map(|m| m.name.as_str()).unwrap_or("MODEL");
    println!(
        "OpenAI clients: base URL {}; Anthropic clients: base URL {root}\n\
         try: curl {}/chat/completions -H 'content-type: application/json' -d '{{\"model\": \"{example}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'",
        r.url, r.url
    );
    Ok(())
}
