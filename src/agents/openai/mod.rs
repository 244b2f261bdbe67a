//! The `openai` backend: an OpenAI-compatible chat completions endpoint as an A2A agent.
//!
//! A task's conversation is its context: the caller's earlier completed tasks with this
//! agent in the same contextId are sent as history (bounded), after the system prompt and
//! before the new message. A send makes one completion; its answer is the task's artifact
//! and the completed status's message. A streaming call asks for `stream: true` and appends
//! each delta to the artifact as it comes. Token counts, the model and the finish reason go
//! into the task's metadata.
//!
//! Canceling the task (or its timeout) drops the HTTP request in flight, which closes its
//! connection. What the provider answers with is mapped to a failed task whose message
//! never repeats the key or a header's value; the details go to the log. A 429 is retried
//! when it says how long to wait and that wait fits in the timeout. See `docs/openai.md`.

mod prompt;
mod wire;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use opentelemetry::KeyValue;
use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, USER_AGENT,
};
use reqwest::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use super::remote::sse::{SseDecoder, SseEvent};
use super::{AgentBackend, BackendError, EventSink, Execution, SinkClosed};
use crate::config::OpenAiConfig;
use crate::error::error_chain;
use crate::protocol::model::{Artifact, Message, Metadata, Part, TaskState};
use wire::{ProviderError, Usage};

/// Retries of one task's call after 429s that say how long to wait.
const MAX_RETRIES: u32 = 3;
/// The most of an answer kept (a whole body, or a streamed answer's text).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// The most of an error body read, for the log.
const MAX_ERROR_BYTES: usize = 64 * 1024;
/// The most of a provider's message repeated to the caller.
const MAX_REPEATED_CHARS: usize = 500;
const ARTIFACT_ID: &str = "answer";

pub(crate) struct OpenAiBackend {
    inner: Arc<Inner>,
}

struct Inner {
    agent: Arc<str>,
    config: OpenAiConfig,
    client: reqwest::Client,
    endpoint: reqwest::Url,
    headers: HeaderMap,
    /// What must never reach a caller or the log: the key and the file's header values.
    secrets: Vec<String>,
}

impl OpenAiBackend {
    pub(crate) fn new(agent: &str, config: OpenAiConfig) -> Result<OpenAiBackend, String> {
        let endpoint = endpoint(&config.base_url)?;
        let mut headers = HeaderMap::new();
        let mut secrets = Vec::new();
        // Validated at load; a failure here is reported, never with the value.
        for (k, v) in &config.headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
            let mut value =
                HeaderValue::from_str(v).map_err(|_| format!("header {k}: not a valid value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
            secrets.push(v.clone());
        }
        if let Some(key) = &config.api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                .map_err(|_| "the API key is not a valid header value".to_string())?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
            secrets.push(key.expose().to_string());
        }
        // Short values (a flag header, say) would blank out ordinary words.
        secrets.retain(|s| s.len() >= 8);
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("a2a-gateway/", env!("CARGO_PKG_VERSION"))),
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // The key is never replayed at an address the file does not name: no redirects.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(config.connect_timeout_secs))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(OpenAiBackend {
            inner: Arc::new(Inner {
                agent: Arc::from(agent),
                config,
                client,
                endpoint,
                headers,
                secrets,
            }),
        })
    }
}

impl AgentBackend for OpenAiBackend {
    fn execute(&self, exec: Execution) -> BoxFuture<'static, Result<(), BackendError>> {
        Box::pin(run(self.inner.clone(), exec))
    }
}

/// `<base_url>/chat/completions`, its query kept (Azure's `api-version`); a base URL that
/// already ends in `/chat/completions` is taken as it is.
fn endpoint(base_url: &str) -> Result<reqwest::Url, String> {
    let mut url =
        reqwest::Url::parse(base_url).map_err(|e| format!("base_url \"{base_url}\": {e}"))?;
    let path = url.path().trim_end_matches('/').to_string();
    if !path.ends_with("/chat/completions") {
        url.set_path(&format!("{path}/chat/completions"));
    }
    Ok(url)
}

/// Why a call gave no answer; each says what the caller is told (and nothing secret).
#[derive(Debug)]
enum Failure {
    /// 401 or 403.
    Credentials(StatusCode),
    /// 429 that was not retried, with the wait it advised.
    RateLimited(Option<Duration>),
    /// Another 4xx, with the provider's own (redacted) message.
    Refused(StatusCode, Option<String>),
    /// 5xx.
    ProviderFailed(StatusCode),
    /// Any other status (a redirect, say).
    Unexpected(StatusCode),
    Unreachable,
    Malformed,
    /// A streamed answer stopped before it was complete.
    BrokeOff,
    /// The provider reported an error in the middle of a streamed answer.
    FailedMidAnswer,
    TimedOut,
    Sink(SinkClosed),
}

impl From<SinkClosed> for Failure {
    fn from(closed: SinkClosed) -> Failure {
        Failure::Sink(closed)
    }
}

impl Failure {
    fn message(&self, timeout_secs: u64) -> String {
        let code = |s: &StatusCode| s.as_u16();
        match self {
            Failure::Credentials(s) => format!(
                "the model provider refused the gateway's credentials (HTTP {})",
                code(s)
            ),
            Failure::RateLimited(Some(wait)) => format!(
                "the model provider is rate-limiting the gateway (HTTP 429); retry in {} s",
                wait.as_secs().max(1)
            ),
            Failure::RateLimited(None) => {
                "the model provider is rate-limiting the gateway (HTTP 429); retry later".into()
            }
            Failure::Refused(s, Some(why)) => {
                format!(
                    "the model provider refused the request (HTTP {}): {why}",
                    code(s)
                )
            }
            Failure::Refused(s, None) => {
                format!("the model provider refused the request (HTTP {})", code(s))
            }
            Failure::ProviderFailed(s) => format!(
                "the model provider failed to answer (HTTP {}); retry later",
                code(s)
            ),
            Failure::Unexpected(s) => format!(
                "the model provider answered with an unexpected HTTP status {}",
                code(s)
            ),
            Failure::Unreachable => "the model provider could not be reached; retry later".into(),
            Failure::Malformed => "the model provider's answer could not be read".into(),
            Failure::BrokeOff => {
                "the model provider's answer broke off before it was complete; retry later".into()
            }
            Failure::FailedMidAnswer => {
                "the model provider failed in the middle of its answer; retry later".into()
            }
            Failure::TimedOut => format!("the model did not answer within {timeout_secs} s"),
            Failure::Sink(_) => "the task was closed".into(),
        }
    }
}

/// A complete answer.
#[derive(Default)]
struct Answer {
    text: String,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    model: Option<String>,
    /// Its artifact was sent chunk by chunk already.
    streamed: bool,
}

impl Answer {
    /// The response attributes of the call's span.
    fn describe(&self, span: &mut crate::telemetry::Child) {
        if let Some(model) = &self.model {
            span.set(KeyValue::new("gen_ai.response.model", model.clone()));
        }
        if let Some(reason) = &self.finish_reason {
            let reasons = opentelemetry::Array::String(vec![reason.clone().into()]);
            span.set(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(reasons),
            ));
        }
        let usage = self.usage.as_ref();
        for (key, n) in [
            (
                "gen_ai.usage.input_tokens",
                usage.and_then(|u| u.prompt_tokens),
            ),
            (
                "gen_ai.usage.output_tokens",
                usage.and_then(|u| u.completion_tokens),
            ),
        ] {
            if let Some(n) = n {
                span.set(KeyValue::new(key, i64::try_from(n).unwrap_or(i64::MAX)));
            }
        }
    }

    /// What the task's metadata gets: `usage`, `model`, `finish_reason`, those known.
    fn metadata(&self) -> Option<Metadata> {
        let mut m = Metadata::new();
        if let Some(usage) = &self.usage {
            m.insert("usage".into(), json!(usage));
        }
        if let Some(model) = &self.model {
            m.insert("model".into(), json!(model));
        }
        if let Some(reason) = &self.finish_reason {
            m.insert("finish_reason".into(), json!(reason));
        }
        (!m.is_empty()).then_some(m)
    }
}

fn answer_artifact(text: String) -> Artifact {
    Artifact {
        artifact_id: ARTIFACT_ID.into(),
        name: Some("answer".into()),
        description: None,
        parts: vec![Part::text(text)],
        metadata: None,
        extensions: Vec::new(),
    }
}

async fn run(inner: Arc<Inner>, exec: Execution) -> Result<(), BackendError> {
    let Execution {
        message,
        task,
        streaming,
        mut events,
        cancel,
    } = exec;
    let cfg = &inner.config;
    // Before anything else: a part the model cannot read is the caller's error, and no
    // task is made for it.
    let content = prompt::content(&message.parts).map_err(BackendError::Refused)?;
    let earlier = match cfg.max_history_messages {
        0 => Vec::new(),
        n => events.earlier_in_context(n).await.map_err(|e| {
            tracing::warn!(agent = %inner.agent, error = %e, "the conversation's earlier turns could not be read");
            BackendError::Unavailable("its conversation's earlier turns could not be read".into())
        })?,
    };
    let turns = prompt::turns(cfg, &earlier, task.as_ref(), &message, content);
    let body = Bytes::from(prompt::body(cfg, &turns, streaming).to_string());
    events.status(TaskState::Working, None).await?;
    let now = Instant::now();
    let deadline = now
        .checked_add(Duration::from_secs(cfg.timeout_secs))
        .unwrap_or_else(|| now + Duration::from_secs(86400 * 365));
    // The call's span (GenAI conventions), when spans are exported; the provider gets it
    // as its parent.
    let mut span = crate::telemetry::child_span(
        format!("chat {}", cfg.model),
        opentelemetry::trace::SpanKind::Client,
        vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", "openai"),
            KeyValue::new("gen_ai.request.model", cfg.model.clone()),
            KeyValue::new(
                "server.address",
                inner.endpoint.host_str().unwrap_or("").to_string(),
            ),
            KeyValue::new("a2a.agent", inner.agent.to_string()),
        ],
    );
    let trace = span.as_ref().map(|s| s.header());
    // Dropping the call on cancel or timeout drops its connection: the provider sees the
    // client go and stops generating.
    let outcome = tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        outcome = tokio::time::timeout_at(deadline, inner.answer(body, streaming, &mut events, deadline, trace)) => outcome,
    };
    if let Some(span) = span.as_mut() {
        match &outcome {
            Ok(Ok(answer)) => answer.describe(span),
            Ok(Err(f)) => span.fail(format!("{f:?}")),
            Err(_) => span.fail("timed out".into()),
        }
    }
    let failure = match outcome {
        Ok(Ok(answer)) => {
            if !answer.streamed {
                events
                    .artifact(answer_artifact(answer.text.clone()), false, true)
                    .await?;
            }
            let metadata = answer.metadata();
            let said = Message::agent_text(answer.text);
            events
                .status_noted(TaskState::Completed, Some(said), metadata)
                .await?;
            return Ok(());
        }
        Ok(Err(Failure::Sink(closed))) => return Err(closed.into()),
        Ok(Err(failure)) => failure,
        Err(_) => {
            tracing::warn!(agent = %inner.agent, timeout_secs = cfg.timeout_secs, "the model did not answer in time");
            Failure::TimedOut
        }
    };
    let said = Message::agent_text(failure.message(cfg.timeout_secs));
    events.status(TaskState::Failed, Some(said)).await?;
    Ok(())
}

impl Inner {
    /// One completion, retried after 429s that say how long to wait, when the wait fits
    /// before `deadline`.
    async fn answer(
        &self,
        body: Bytes,
        streaming: bool,
        events: &mut EventSink,
        deadline: Instant,
        trace: Option<(String, Option<String>)>,
    ) -> Result<Answer, Failure> {
        let mut retries = 0;
        loop {
            let mut request = self
                .client
                .post(self.endpoint.clone())
                .headers(self.headers.clone())
                .body(body.clone());
            if let Some((parent, state)) = &trace {
                request = request.header("traceparent", parent);
                if let Some(state) = state {
                    request = request.header("tracestate", state);
                }
            }
            let resp = request
                .send()
                .await
                .map_err(|e| {
                    tracing::warn!(agent = %self.agent, host = self.endpoint.host_str().unwrap_or(""), error = %error_chain(&e.without_url()), "the model provider could not be reached");
                    Failure::Unreachable
                })?;
            let status = resp.status();
            if status.is_success() {
                let event_stream = resp
                    .headers()
                    .get(CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("text/event-stream"));
                // A server that ignores `stream: true` answers whole; that does too.
                return match streaming && event_stream {
                    true => self.streamed(resp, events).await,
                    false => self.whole(resp).await,
                };
            }
            let advised = wire::retry_after(resp.headers());
            let error = self.error_body(resp).await;
            if status == StatusCode::TOO_MANY_REQUESTS {
                let wait = advised.filter(|w| {
                    retries < MAX_RETRIES
                        && Instant::now().checked_add(*w).is_some_and(|t| t < deadline)
                });
                self.log_refusal(status, &error, wait);
                if let Some(wait) = wait {
                    retries += 1;
                    tokio::time::sleep(wait).await;
                    continue;
                }
                return Err(Failure::RateLimited(advised));
            }
            self.log_refusal(status, &error, None);
            return Err(match status.as_u16() {
                401 | 403 => Failure::Credentials(status),
                400..=499 => Failure::Refused(status, error.message.map(|m| self.repeatable(&m))),
                500..=599 => Failure::ProviderFailed(status),
                _ => Failure::Unexpected(status),
            });
        }
    }

    /// A whole (non-streamed) completion.
    async fn whole(&self, resp: reqwest::Response) -> Result<Answer, Failure> {
        let body = read_capped(resp, MAX_ANSWER_BYTES).await.map_err(|e| {
            tracing::warn!(agent = %self.agent, error = %e, "the model provider's answer could not be read");
            Failure::Malformed
        })?;
        let completion: wire::Completion = serde_json::from_slice(&body).map_err(|e| {
            tracing::warn!(agent = %self.agent, error = %e, bytes = body.len(), "the model provider's answer is not a chat completion");
            Failure::Malformed
        })?;
        let Some(choice) = completion.choices.into_iter().next() else {
            tracing::warn!(agent = %self.agent, "the model provider's answer has no choices");
            return Err(Failure::Malformed);
        };
        Ok(Answer {
            text: choice
                .message
                .and_then(wire::Said::text)
                .unwrap_or_default(),
            usage: completion.usage,
            finish_reason: choice.finish_reason,
            model: completion.model,
            streamed: false,
        })
    }

    /// A streamed completion: each delta is appended to the artifact as it comes, one
    /// behind, so that the last chunk can say it is the last.
    async fn streamed(
        &self,
        resp: reqwest::Response,
        events: &mut EventSink,
    ) -> Result<Answer, Failure> {
        let mut body = resp.bytes_stream();
        let mut decoder = SseDecoder::default();
        let mut pending: VecDeque<SseEvent> = VecDeque::new();
        let mut answer = Answer {
            streamed: true,
            ..Answer::default()
        };
        let mut held: Option<String> = None;
        let mut sent = 0usize;
        let done = 'read: loop {
            while let Some(event) = pending.pop_front() {
                let data = event.data.trim();
                if data == "[DONE]" {
                    break 'read true;
                }
                let chunk: wire::Chunk = serde_json::from_str(data).map_err(|e| {
                    tracing::warn!(agent = %self.agent, error = %e, "a streamed chunk from the model provider is not a chat completion chunk");
                    Failure::Malformed
                })?;
                if let Some(error) = &chunk.error {
                    self.log_refusal(StatusCode::OK, &ProviderError::of(error), None);
                    return Err(Failure::FailedMidAnswer);
                }
                answer.model = chunk.model.or(answer.model.take());
                answer.usage = chunk.usage.or(answer.usage.take());
                for choice in chunk.choices.into_iter().take(1) {
                    if choice.finish_reason.is_some() {
                        answer.finish_reason = choice.finish_reason;
                    }
                    let piece = choice.delta.and_then(wire::Said::text).unwrap_or_default();
                    if piece.is_empty() {
                        continue;
                    }
                    if answer.text.len() + piece.len() > MAX_ANSWER_BYTES {
                        tracing::warn!(agent = %self.agent, "the model's streamed answer exceeded {MAX_ANSWER_BYTES} bytes");
                        return Err(Failure::Malformed);
                    }
                    answer.text.push_str(&piece);
                    if let Some(before) = held.replace(piece) {
                        events
                            .artifact(answer_artifact(before), sent > 0, false)
                            .await?;
                        sent += 1;
                    }
                }
            }
            match body.next().await {
                Some(Ok(bytes)) => decoder.feed(&bytes, &mut pending).map_err(|e| {
                    tracing::warn!(agent = %self.agent, error = %e, "the model provider's stream could not be read");
                    Failure::Malformed
                })?,
                Some(Err(e)) => {
                    tracing::warn!(agent = %self.agent, error = %error_chain(&e.without_url()), "the model provider's stream broke off");
                    return Err(Failure::BrokeOff);
                }
                None => break false,
            }
        };
        // A stream that ends without `[DONE]` is whole only if the model said it finished.
        if !done && answer.finish_reason.is_none() {
            tracing::warn!(agent = %self.agent, "the model provider's stream ended before the answer was complete");
            return Err(Failure::BrokeOff);
        }
        let last = held.unwrap_or_default();
        events
            .artifact(answer_artifact(last), sent > 0, true)
            .await?;
        Ok(answer)
    }

    /// What an error answer says, for the log and (redacted) for the caller.
    async fn error_body(&self, resp: reqwest::Response) -> ProviderError {
        match read_capped(resp, MAX_ERROR_BYTES).await {
            Ok(body) => ProviderError::read(&body),
            Err(_) => ProviderError::default(),
        }
    }

    fn log_refusal(&self, status: StatusCode, error: &ProviderError, retry_in: Option<Duration>) {
        let redact =
            |v: &Option<String>| v.as_deref().map(|s| self.redacted(s)).unwrap_or_default();
        tracing::warn!(
            agent = %self.agent,
            status = status.as_u16(),
            provider_type = %redact(&error.kind),
            provider_code = %redact(&error.code),
            provider_message = %redact(&error.message),
            retry_in_ms = retry_in.map(|w| w.as_millis() as u64),
            "the model provider answered with an error"
        );
    }

    /// `text` with every secret of this agent blanked out.
    fn redacted(&self, text: &str) -> String {
        self.secrets.iter().fold(text.to_string(), |t, secret| {
            t.replace(secret.as_str(), "[redacted]")
        })
    }

    /// A provider's message as the caller may see it: redacted and cut short.
    fn repeatable(&self, text: &str) -> String {
        let text = self.redacted(text);
        match text.char_indices().nth(MAX_REPEATED_CHARS) {
            Some((end, _)) => format!("{}…", &text[..end]),
            None => text,
        }
    }
}

/// The body, up to `cap` bytes; more is an error.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| error_chain(&e.without_url()))?
    {
        if out.len() + chunk.len() > cap {
            return Err(format!("the body exceeds {cap} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_joins_the_base_url() {
        for (base, want) in [
            ("http://localhost:11434/v1", "http://localhost:11434/v1/chat/completions"),
            ("http://localhost:11434/v1/", "http://localhost:11434/v1/chat/completions"),
            ("http://h:8000", "http://h:8000/chat/completions"),
            (
                "https://r.openai.azure.com/openai/deployments/gpt?api-version=2024-06-01",
                "https://r.openai.azure.com/openai/deployments/gpt/chat/completions?api-version=2024-06-01",
            ),
            ("http://h/v1/chat/completions", "http://h/v1/chat/completions"),
        ] {
            assert_eq!(endpoint(base).unwrap().as_str(), want, "{base}");
        }
    }
}
