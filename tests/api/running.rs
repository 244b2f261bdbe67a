//! The real binary as a child process, for tests that signal it, restart it or read its
//! log.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{rpc, write_config};

/// The gateway this test suite was built with.
fn this_build() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_a2a-gateway"))
}

/// The real binary, serving a configuration directory; killed when dropped.
pub struct Running {
    pub child: Child,
    pub base: String,
    pub log: PathBuf,
    pub dir: tempfile::TempDir,
    pub agents: PathBuf,
    pub gateway: PathBuf,
    pub log_level: String,
    pub client: reqwest::Client,
    /// The gateway binary it runs (this build's, or an earlier release's).
    binary: PathBuf,
    /// Worker threads (`--workers`).
    workers: usize,
    /// Environment variables it is started with (again on a restart).
    env: Vec<(String, String)>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Serves `files` in agents.d and `gateway` beside it, logging JSON at `log_level` to a
    /// file. Returns once the banner names the port.
    pub fn start(files: &[(&str, &str)], gateway: &str, log_level: &str) -> Running {
        Running::start_workers(files, gateway, log_level, 1)
    }

    /// [`Running::start`] with `workers` worker threads.
    pub fn start_workers(
        files: &[(&str, &str)],
        gateway: &str,
        log_level: &str,
        workers: usize,
    ) -> Running {
        Running::launched(
            this_build(),
            files,
            gateway,
            log_level,
            (workers, Vec::new()),
        )
    }

    /// [`Running::start`] with another build of the gateway: `binary`.
    pub fn start_binary(
        binary: &Path,
        files: &[(&str, &str)],
        gateway: &str,
        log_level: &str,
    ) -> Running {
        Running::launched(binary, files, gateway, log_level, (1, Vec::new()))
    }

    /// [`Running::start`] with environment variables of its own.
    pub fn start_env(
        files: &[(&str, &str)],
        gateway: &str,
        log_level: &str,
        env: &[(&str, &str)],
    ) -> Running {
        let env = (env.iter()).map(|(k, v)| (k.to_string(), v.to_string()));
        Running::launched(this_build(), files, gateway, log_level, (1, env.collect()))
    }

    fn launched(
        binary: &Path,
        files: &[(&str, &str)],
        gateway: &str,
        log_level: &str,
        (workers, env): (usize, Vec<(String, String)>),
    ) -> Running {
        let (dir, agents, gateway_path) = write_config(files, Some(gateway));
        let log = dir.path().join("gateway.log");
        let gateway_path = gateway_path.expect("gateway file");
        let at = Launch {
            binary,
            dir: dir.path(),
            gateway: &gateway_path,
            agents: &agents,
            log: &log,
            log_level,
            workers,
            env: &env,
        };
        let (child, base) = launch(&at, "0");
        Running {
            child,
            base,
            log,
            dir,
            agents,
            gateway: gateway_path,
            log_level: log_level.to_string(),
            client: crate::helpers::client(),
            binary: binary.to_path_buf(),
            workers,
            env,
        }
    }

    /// Serves the agent files of `agents` (a directory of its own: the repository's
    /// `agents.d/`, say) with `gateway` in a temporary directory.
    pub fn start_with_agents(agents: &Path, gateway: &str, log_level: &str) -> Running {
        let (dir, _, gateway_path) = write_config(&[], Some(gateway));
        let log = dir.path().join("gateway.log");
        let gateway_path = gateway_path.expect("gateway file");
        let at = Launch {
            binary: this_build(),
            dir: dir.path(),
            gateway: &gateway_path,
            agents,
            log: &log,
            log_level,
            workers: 1,
            env: &[],
        };
        let (child, base) = launch(&at, "0");
        Running {
            child,
            base,
            log,
            dir,
            agents: agents.to_path_buf(),
            gateway: gateway_path,
            log_level: log_level.to_string(),
            client: crate::helpers::client(),
            binary: this_build().to_path_buf(),
            workers: 1,
            env: Vec::new(),
        }
    }

    /// Starts the gateway again on the same files and port (after it exited or was
    /// killed); its log goes on in the same file.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let port = self.base.rsplit(':').next().unwrap_or("0").to_string();
        let at = Launch {
            binary: &self.binary,
            dir: self.dir.path(),
            gateway: &self.gateway,
            agents: &self.agents,
            log: &self.log,
            log_level: &self.log_level,
            workers: self.workers,
            env: &self.env,
        };
        let (child, base) = launch(&at, &port);
        self.child = child;
        self.base = base;
        // Pooled connections were to the process that is gone.
        self.client = crate::helpers::client();
    }

    /// SIGKILL: no drain, no flush, as a crash.
    pub fn kill_hard(&mut self) {
        self.signal("KILL");
        let _ = self.child.wait();
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    }

    pub fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
            .collect()
    }

    /// Waits until a log line satisfies `f`.
    pub async fn wait_for_log(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.log_lines().into_iter().find(|l| f(l)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no log line {what}; the log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A 1.0 JSON-RPC call; its answer.
    pub async fn call(&self, path: &str, method: &str, params: Value) -> Value {
        self.post(path, method, params, &[])
            .await
            .json()
            .await
            .unwrap()
    }

    /// [`Self::call`] with an API key.
    pub async fn call_as(&self, path: &str, key: &str, method: &str, params: Value) -> Value {
        let key = [("X-API-Key", key)];
        self.post(path, method, params, &key)
            .await
            .json()
            .await
            .unwrap()
    }

    /// A 1.0 JSON-RPC call with `headers`; the response, status and headers included.
    pub async fn post(
        &self,
        path: &str,
        method: &str,
        params: Value,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url(path))
            .header("A2A-Version", "1.0")
            .body(rpc(method, params));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.send().await.unwrap()
    }

    /// `SendMessage` of `text` on `/a2a`: the task it answered (a call that fails fails the
    /// test).
    pub async fn send_task(&self, text: &str, configuration: Value) -> Value {
        let message = crate::helpers::D::V10.message(text);
        let answer = self
            .call(
                "/a2a",
                "SendMessage",
                serde_json::json!({"message": message, "configuration": configuration}),
            )
            .await;
        assert!(answer.get("error").is_none(), "{answer}");
        answer["result"]["task"].clone()
    }

    /// `serve` once more on the same files while this one runs or after it stopped: how
    /// that second start ended (it is expected to refuse).
    pub fn serve_again(&self) -> std::process::Output {
        Command::new(&self.binary)
            .current_dir(self.dir.path())
            .args(["serve", "--port", "0", "--config"])
            .arg(&self.gateway)
            .arg("--agents-dir")
            .arg(&self.agents)
            .output()
            .unwrap()
    }

    pub async fn agent_names(&self) -> Vec<String> {
        let list: Value = self
            .client
            .get(self.url("/a2a/agents"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap().to_string())
            .collect()
    }

    pub async fn wait_for_agents(&self, want: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let names = self.agent_names().await;
            if names == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "agents {names:?}, expected {want:?}; the log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits for the process to exit; its status and how long that took.
    pub fn wait_exit(&mut self, within: Duration) -> (std::process::ExitStatus, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, start.elapsed());
            }
            assert!(start.elapsed() < within, "did not exit within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs the binary on these files and returns once its banner names the port.
/// Where and how a gateway process is started.
struct Launch<'a> {
    binary: &'a Path,
    dir: &'a Path,
    gateway: &'a Path,
    agents: &'a Path,
    log: &'a Path,
    log_level: &'a str,
    workers: usize,
    env: &'a [(String, String)],
}

fn launch(at: &Launch<'_>, port: &str) -> (Child, String) {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(at.log)
        .expect("log file");
    let workers = at.workers.to_string();
    let mut child = Command::new(at.binary)
        .current_dir(at.dir)
        .args([
            "serve",
            "--port",
            port,
            "--workers",
            &workers,
            "--log-format",
            "json",
        ])
        .arg("--config")
        .arg(at.gateway)
        .arg("--agents-dir")
        .arg(at.agents)
        .env("A2A_GATEWAY_LOG", at.log_level)
        .envs(at.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .expect("the gateway starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("banner");
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| {
            panic!(
                "no URL in the banner: {first:?}; the log:\n{}",
                std::fs::read_to_string(at.log).unwrap_or_default()
            )
        })
        .to_string();
    (child, base)
}
