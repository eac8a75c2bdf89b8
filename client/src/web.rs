//! `coli web`: the dashboard (chat, the expert cache live, models and sessions) in a
//! browser. Makes sure colibrid runs (starting it if needed), loads the models asked for,
//! has the daemon serve HTTP (the same listener as the OpenAI/Anthropic API), then opens
//! the page in the default browser, or prints its address where there is none.

use crate::args::Global;
use crate::daemon_discovery::{self, RpcResult};
use crate::manage::parse_size;
use crate::output::{print_json, OutputFormat};
use crate::remote::{load_model_reporting, model_id};
use clap::Args;
use colibri_proto::v1 as pb;
use serde_json::json;
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(Args, Debug)]
pub struct WebArgs {
    /// Model folder to load first (repeat it for several).
    #[arg(long, value_name = "DIR")]
    pub model: Vec<PathBuf>,
    /// Where the daemon listens for HTTP when it does not yet (a non-loopback address needs
    /// an API key).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:11435")]
    pub http: String,
    /// The API key the page must send [default: the daemon's own, if it has one]. The
    /// browser gets it in the address's fragment, which is never sent over the network.
    #[arg(long, env = "COLIBRI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Expert cache budget of the models loaded now, e.g. 8G [default: the daemon's].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub expert_cache: Option<u64>,
    /// Print the address instead of opening a browser.
    #[arg(long)]
    pub no_open: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn web(global: &Global, args: WebArgs) -> anyhow::Result<()> {
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
    let page = page_url(&r.url);
    let with_key = match &args.api_key {
        Some(k) => format!("{page}#key={}", percent_encode(k)),
        None => page.clone(),
    };
    let opened = if args.no_open {
        Err("--no-open".to_string())
    } else {
        open_browser(&with_key)
    };
    if args.output == OutputFormat::Json {
        return print_json(&json!({
            "url": page,
            "api": r.url,
            "started": r.started,
            "opened": opened.is_ok(),
            "models": r.models.iter().map(|m| json!({"name": m.name, "id": m.id})).collect::<Vec<_>>(),
        }));
    }
    println!("{page}");
    match (&opened, args.no_open) {
        (Ok(how), _) => eprintln!("opened the dashboard with {how}"),
        (Err(_), true) => {}
        (Err(why), false) => eprintln!("open {page} in a browser ({why})"),
    }
    if args.api_key.is_some() && opened.is_err() {
        eprintln!("the page asks for the API key (or add #key=KEY to the address)");
    }
    Ok(())
}

/// The dashboard's address from the API's base URL (`http://H:P/v1` → `http://H:P/`).
fn page_url(api: &str) -> String {
    format!("{}/", api.trim_end_matches('/').trim_end_matches("/v1"))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Opens `url` in the default browser: `$BROWSER` when set (as xdg-open and Python's
/// webbrowser honour it), else the platform's opener. Fails where there is no display.
fn open_browser(url: &str) -> Result<String, String> {
    let (program, pre): (String, Vec<&str>) = match std::env::var("BROWSER") {
        Ok(b) if !b.trim().is_empty() => (b.split(':').next().unwrap_or(&b).to_string(), vec![]),
        _ if cfg!(target_os = "macos") => ("open".into(), vec![]),
        _ if cfg!(windows) => ("cmd".into(), vec!["/C", "start", ""]),
        _ => {
            let display = ["DISPLAY", "WAYLAND_DISPLAY"]
                .iter()
                .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
            if !display {
                return Err("no display to open a browser on".into());
            }
            ("xdg-open".into(), vec![])
        }
    };
    Command::new(&program)
        .args(pre)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|_| program.clone())
        .map_err(|e| format!("could not run {program}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            page_url("http://127.0.0.1:11435/v1"),
            "http://127.0.0.1:11435/"
        );
        assert_eq!(page_url("http://[::1]:9/v1/"), "http://[::1]:9/");
        assert_eq!(percent_encode("a b/c~"), "a%20b%2Fc~");
    }
}
