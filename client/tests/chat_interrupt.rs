//! Ctrl-C while `coli chat` streams a reply through the daemon: the reply stops (the footer
//! says "stopped"), the daemon's request is cancelled (the session is idle again at once),
//! the chat goes on, and the session keeps exactly what was shown, so the next turn works.

mod common;

use common::ensure_daemon_binary;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The olmoe fixture with room for a reply far longer than the test lets it run: the tiny
/// model writes thousands of tokens a second, and a 256-position context would end the reply
/// before Ctrl-C could reach it.
fn long_context_model(dir: &Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe");
    let dst = dir.join("olmoe-long");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let cfg_path = dst.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["max_position_embeddings"] = 65536.into();
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    dst
}

/// Bytes a child writes, collected by a thread.
struct Pipe {
    rx: Receiver<Vec<u8>>,
    seen: Vec<u8>,
}

impl Pipe {
    fn new(mut r: impl Read + Send + 'static) -> Pipe {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Pipe {
            rx,
            seen: Vec::new(),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Takes what has arrived within `wait`.
    fn drain(&mut self, wait: Duration) {
        let end = Instant::now() + wait;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.rx.recv_timeout(left) {
                Ok(b) => self.seen.extend(b),
                Err(_) => break,
            }
        }
    }

    /// Waits until `done(text)` holds; panics after `limit`.
    fn wait_for(&mut self, what: &str, limit: Duration, done: impl Fn(&str) -> bool) -> Duration {
        let t = Instant::now();
        while !done(&self.text()) {
            let left = limit
                .checked_sub(t.elapsed())
                .unwrap_or_else(|| panic!("no {what} within {limit:?}: {}", self.text()));
            if let Ok(b) = self.rx.recv_timeout(left.min(Duration::from_millis(50))) {
                self.seen.extend(b);
            }
        }
        t.elapsed()
    }
}

struct Chat {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Pipe,
    err: Pipe,
}

impl Chat {
    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -INT");
    }

    /// Waits until the reply streams (output grows by `bytes`), then presses Ctrl-C and
    /// waits for the footer. Returns the time from Ctrl-C to the footer.
    fn interrupt_reply(&mut self, footers_before: usize) -> Duration {
        let start = self.out.seen.len();
        self.out
            .wait_for("streaming reply", Duration::from_secs(60), |t| {
                t.len() > start + 2000
            });
        // Still streaming: Ctrl-C lands mid-reply, not after it.
        assert_eq!(
            self.err.text().matches("tok/s").count(),
            footers_before,
            "the reply ended before Ctrl-C: {}",
            self.err.text()
        );
        self.interrupt();
        self.err
            .wait_for("footer after Ctrl-C", Duration::from_secs(30), |t| {
                t.matches("tok/s").count() > footers_before
            })
    }
}

/// Stops the daemon that `coli chat` started for the test, when the test ends (even on
/// failure): an auto-started daemon is detached and would outlive the test.
struct StopDaemon {
    socket: PathBuf,
    state: PathBuf,
}

impl Drop for StopDaemon {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_coli"))
            .arg("--socket")
            .arg(&self.socket)
            .args(["stop", "--timeout", "30"])
            .env("COLIBRI_STATE_DIR", &self.state)
            .output();
    }
}

#[test]
fn ctrl_c_mid_reply_stops_it_cancels_the_request_and_the_chat_goes_on() {
    ensure_daemon_binary();
    let tmp = tempfile::tempdir().unwrap();
    let model = long_context_model(tmp.path());
    let socket = tmp.path().join("run").join("colibrid.sock");
    let state = tmp.path().join("state");
    // Declared after `tmp`, so dropped (daemon stopped) before the folder goes.
    let _stop = StopDaemon {
        socket: socket.clone(),
        state: state.clone(),
    };
    let coli = |args: &[&str]| -> Output {
        Command::new(env!("CARGO_BIN_EXE_coli"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .env("COLIBRI_STATE_DIR", &state)
            .env_remove("COLI_NO_AUTOSTART")
            .output()
            .unwrap()
    };
    let sessions = || -> Value {
        let o = coli(&["sessions", "--output", "json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let spawn_chat = |extra: &[&str]| -> Chat {
        let mut child = Command::new(env!("CARGO_BIN_EXE_coli"))
            .arg("--socket")
            .arg(&socket)
            .arg("chat")
            .args(extra)
            .env("COLIBRI_STATE_DIR", &state)
            .env_remove("COLI_NO_AUTOSTART")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Chat {
            stdin: child.stdin.take(),
            out: Pipe::new(child.stdout.take().unwrap()),
            err: Pipe::new(child.stderr.take().unwrap()),
            child,
        }
    };

    let mut chat = spawn_chat(&[
        "--model",
        model.to_str().unwrap(),
        "--new",
        "--max-tokens",
        "60000",
        "--temperature",
        "0",
    ]);
    chat.say("tell me a long story");
    let stop = chat.interrupt_reply(0);
    assert!(stop < Duration::from_secs(10), "Ctrl-C took {stop:?}");
    assert!(chat.err.text().contains("stopped"), "{}", chat.err.text());
    // The reply has stopped: nothing more arrives.
    chat.out.drain(Duration::from_millis(300));
    let first = chat.out.text();
    chat.out.drain(Duration::from_millis(500));
    assert_eq!(chat.out.text(), first, "output went on after the footer");
    // The daemon's request was cancelled, not left running: the session is idle already.
    let s = sessions();
    let session = &s["sessions"][0];
    assert_eq!(session["state"], "live", "{s}");
    assert_eq!(session["messages"], 2, "{s}");
    let tokens_after_first = session["history_tokens"].as_u64().unwrap();
    assert!(
        tokens_after_first < 60000,
        "the reply was cut short: {tokens_after_first} tokens"
    );

    // coli is still there, the next turn streams (promptly) and can be stopped again.
    assert!(chat.child.try_wait().unwrap().is_none(), "coli exited");
    let t = Instant::now();
    chat.say("and another one");
    chat.interrupt_reply(1);
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "second turn took {:?}",
        t.elapsed()
    );
    let transcript = tmp.path().join("transcript.md");
    chat.say(&format!("/save {}", transcript.display()));
    chat.say("/exit");
    drop(chat.stdin.take());
    let status = chat.child.wait().unwrap();
    chat.out.drain(Duration::from_millis(200));
    chat.err.drain(Duration::from_millis(200));
    assert!(
        status.success(),
        "chat exited with {status}: {}",
        chat.err.text()
    );
    let shown = chat.out.text();

    let s = sessions();
    let session = &s["sessions"][0];
    assert_eq!(session["messages"], 4, "{s}");
    assert_eq!(session["state"], "live", "{s}");
    assert!(session["history_tokens"].as_u64().unwrap() > tokens_after_first);

    // What the daemon keeps is what was shown: re-attach (the daemon's messages) and save.
    let again = tmp.path().join("again.md");
    let mut chat = spawn_chat(&[]);
    chat.say(&format!("/save {}", again.display()));
    chat.say("/exit");
    drop(chat.stdin.take());
    assert!(chat.child.wait().unwrap().success());
    chat.err.drain(Duration::from_millis(200));
    assert!(
        chat.err.text().contains("resumed session"),
        "{}",
        chat.err.text()
    );
    let saved = std::fs::read_to_string(&transcript).unwrap();
    let resumed = std::fs::read_to_string(&again).unwrap();
    assert_eq!(
        saved, resumed,
        "coli's and the daemon's conversations differ"
    );
    let replies: Vec<&str> = saved
        .split("**assistant**\n\n")
        .skip(1)
        .map(|r| r.split("\n\n**user**").next().unwrap().trim_end())
        .collect();
    assert_eq!(replies.len(), 2, "{saved}");
    for r in &replies {
        assert!(r.len() > 100, "a partial reply is kept: {r:?}");
        assert!(shown.contains(r), "the kept reply is what was shown");
    }
}
