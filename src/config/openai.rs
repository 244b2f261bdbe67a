//! `kind = "openai"`: an OpenAI-compatible chat completions endpoint (OpenAI, Azure OpenAI,
//! vLLM, llama.cpp's server, Ollama's `/v1`, LiteLLM) as an agent. What the backend does
//! with these settings is in `docs/openai.md`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API's base URL, e.g. `http://localhost:11434/v1` or `https://api.openai.com/v1`;
    /// calls go to `<base_url>/chat/completions`, keeping a query it holds (Azure's
    /// `?api-version=...`).
    pub base_url: String,
    pub model: String,
    /// The environment variable that holds the API key, read when the file is loaded and
    /// sent as `Authorization: Bearer <key>`. Unset: no key (local servers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The system message that opens every conversation.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// The system message from a file, relative to the agent file's directory; read when the
    /// file is loaded. Either this or `system_prompt`.
    #[serde(default)]
    pub system_prompt_file: Option<PathBuf>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// More fields of the request body (`top_p`, `stop`, `response_format`, `seed`, ...),
    /// merged as they are. `model`, `messages`, `stream` and `stream_options` are the
    /// gateway's.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, Value>")]
    pub extra: Map<String, Value>,
    /// Sent with every request; `${VAR}` is replaced from the environment (Azure's
    /// `api-key = "${AZURE_OPENAI_API_KEY}"`, say).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A task's whole call, retries after 429 and a streamed answer included.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// Earlier messages of the conversation (its contextId) sent with a new one, newest kept.
    #[serde(default = "default_history_messages")]
    pub max_history_messages: usize,
    /// The same, bounded in tokens, approximated as characters / 4 per message.
    #[serde(default = "default_history_tokens")]
    pub max_history_tokens: usize,
    /// The key `api_key_env` names, read at load.
    #[serde(skip)]
    pub api_key: Option<ApiKey>,
}

/// An API key: compared (a changed key is a changed backend on reload), never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

fn default_timeout() -> u64 {
    120
}
fn default_connect_timeout() -> u64 {
    10
}
fn default_history_messages() -> usize {
    20
}
fn default_history_tokens() -> usize {
    8000
}

/// Request fields the gateway writes itself.
const RESERVED: &[&str] = &["model", "messages", "stream", "stream_options"];

impl OpenAiConfig {
    /// Checks the settings, reads the key and the prompt file. `dir` is the agent file's
    /// directory (absolute); `text` the file, to place problems. Headers are checked (and
    /// their `${VAR}` expanded) beside this, as an upstream agent's are.
    pub(super) fn check(&mut self, dir: &Path, report: &mut dyn FnMut(usize, String), text: &str) {
        let find = |needle: &str| text.find(needle).unwrap_or(0);
        match url::Url::parse(&self.base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {}
            _ => report(
                find("base_url"),
                format!(
                    "backend.base_url must be an http(s) URL like \"http://localhost:11434/v1\", got \"{}\"",
                    self.base_url
                ),
            ),
        }
        if self.model.trim().is_empty() {
            report(find("model"), "backend.model must not be empty".into());
        }
        if let Some(var) = &self.api_key_env {
            match std::env::var(var) {
                Ok(key) if key.trim().is_empty() => report(
                    find("api_key_env"),
                    format!("environment variable {var} (backend.api_key_env) is empty"),
                ),
                Ok(key) => {
                    let key = key.trim().to_string();
                    // The value is never shown, only that it cannot be sent.
                    if reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
                        report(
                            find("api_key_env"),
                            format!("environment variable {var} (backend.api_key_env) holds characters an HTTP header cannot carry"),
                        );
                    }
                    self.api_key = Some(ApiKey(key));
                }
                Err(std::env::VarError::NotPresent) => report(
                    find("api_key_env"),
                    format!("environment variable {var} (backend.api_key_env) is not set"),
                ),
                Err(std::env::VarError::NotUnicode(_)) => report(
                    find("api_key_env"),
                    format!("environment variable {var} (backend.api_key_env) is not valid UTF-8"),
                ),
            }
            if let Some(name) = self
                .headers
                .keys()
                .find(|h| h.eq_ignore_ascii_case("authorization"))
            {
                report(
                    find(name),
                    format!("backend.headers.{name} and backend.api_key_env both set Authorization; keep one"),
                );
            }
        }
        if self.system_prompt.is_some() && self.system_prompt_file.is_some() {
            report(
                find("system_prompt_file"),
                "backend.system_prompt and backend.system_prompt_file: set one of them".into(),
            );
        } else if let Some(file) = &self.system_prompt_file {
            let path = dir.join(file);
            match std::fs::read_to_string(&path) {
                Ok(prompt) => self.system_prompt = Some(prompt),
                Err(e) => report(
                    find("system_prompt_file"),
                    format!(
                        "backend.system_prompt_file: cannot read {}: {e}",
                        path.display()
                    ),
                ),
            }
            self.system_prompt_file = Some(path);
        }
        if let Some(t) = self.temperature {
            if !(t.is_finite() && t >= 0.0) {
                report(
                    find("temperature"),
                    format!("backend.temperature must be a number of at least 0, got {t}"),
                );
            }
        }
        if self.max_tokens == Some(0) {
            report(
                find("max_tokens"),
                "backend.max_tokens must be at least 1".into(),
            );
        }
        for (key, value) in [
            ("timeout_secs", self.timeout_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
        ] {
            if value == 0 {
                report(find(key), format!("backend.{key} must be at least 1"));
            }
        }
        for key in self.extra.keys() {
            if RESERVED.contains(&key.as_str()) {
                report(
                    find(key),
                    format!("backend.extra.{key}: the gateway sets `{key}` itself"),
                );
            }
        }
        for (key, set) in [
            ("temperature", self.temperature.is_some()),
            ("max_tokens", self.max_tokens.is_some()),
        ] {
            if set && self.extra.contains_key(key) {
                report(
                    find("extra"),
                    format!("backend.{key} and backend.extra.{key}: set one of them"),
                );
            }
        }
    }
}
