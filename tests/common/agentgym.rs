//! The example servers of `http://` environments (examples/agentgym/),
//! started by a test on a free port and killed when it ends.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The interpreter the servers run under (`TRACE_TRAIN_PYTHON`, else
/// `python3`).
pub fn python() -> String {
    std::env::var("TRACE_TRAIN_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A server of examples/agentgym/ on a free port, killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Starts `script` with `args` and waits for its `listening on PORT`.
    pub fn start(script: &str, args: &[&str]) -> Server {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agentgym");
        let mut child = Command::new(python())
            .current_dir(dir)
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} {script}: {e}", python()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{script} did not start: {line:?}"));
        Server { child, port }
    }

    /// `http://127.0.0.1:PORT` followed by `query`.
    pub fn url(&self, query: &str) -> String {
        format!("http://127.0.0.1:{}{query}", self.port)
    }

    /// What the server counted (`GET /stats`).
    pub fn stats(&self) -> serde_json::Value {
        ureq::get(&self.url("/stats"))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
