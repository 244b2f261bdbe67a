//! The chat completions API's answers as the gateway reads them: a whole completion, a
//! streamed chunk, an error body, and how long a 429 says to wait. Lenient: only what the
//! gateway uses is read, and servers that leave things out (usage, say) are fine.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Deserialize)]
pub(super) struct Completion {
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) choices: Vec<Choice>,
    #[serde(default)]
    pub(super) usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Choice {
    #[serde(default)]
    pub(super) message: Option<Said>,
    #[serde(default)]
    pub(super) finish_reason: Option<String>,
}

/// A whole answer's message, or a chunk's delta.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Said {
    #[serde(default)]
    pub(super) content: Option<String>,
    /// What a model that declines says instead of `content` (OpenAI).
    #[serde(default)]
    pub(super) refusal: Option<String>,
}

impl Said {
    pub(super) fn text(self) -> Option<String> {
        self.content.or(self.refusal)
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct Chunk {
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub(super) usage: Option<Usage>,
    /// Some servers report a failure mid-stream as a chunk of its own.
    #[serde(default)]
    pub(super) error: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ChunkChoice {
    #[serde(default)]
    pub(super) delta: Option<Said>,
    #[serde(default)]
    pub(super) finish_reason: Option<String>,
}

/// Token counts, as the provider reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
pub(super) struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) prompt_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) total_tokens: Option<u64>,
}

/// What an error body says: OpenAI's `{"error": {"message", "type", "param", "code"}}`,
/// a bare `{"error": "text"}`, or anything else (then nothing).
#[derive(Debug, Default, PartialEq)]
pub(super) struct ProviderError {
    pub(super) message: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) code: Option<String>,
}

impl ProviderError {
    pub(super) fn read(body: &[u8]) -> ProviderError {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => ProviderError::of(v.get("error").unwrap_or(&v)),
            Err(_) => ProviderError::default(),
        }
    }

    pub(super) fn of(error: &Value) -> ProviderError {
        let text = |v: Option<&Value>| match v {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        match error {
            Value::String(s) => ProviderError {
                message: Some(s.clone()),
                ..ProviderError::default()
            },
            v => ProviderError {
                message: text(v.get("message")),
                kind: text(v.get("type")),
                code: text(v.get("code")),
            },
        }
    }
}

/// The longest wait a 429 may ask for that is still read as a number of seconds.
const MAX_ADVISED_WAIT_SECS: f64 = 1e7;

/// How long a 429 asks the gateway to wait: `retry-after-ms` (OpenAI's), else
/// `retry-after` in seconds or as an HTTP date. None when it does not say.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let secs = |v: f64| {
        (v.is_finite() && v >= 0.0).then(|| Duration::from_secs_f64(v.min(MAX_ADVISED_WAIT_SECS)))
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return secs(ms / 1000.0);
    }
    let value = header("retry-after")?;
    if let Ok(n) = value.parse::<f64>() {
        return secs(n);
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_reads_every_form() {
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "250"), ("retry-after", "9")])),
            Some(Duration::from_millis(250))
        );
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        let wait = retry_after(&headers(&[("retry-after", &soon)])).unwrap();
        assert!(wait <= Duration::from_secs(30) && wait >= Duration::from_secs(20));
        let past = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(
            retry_after(&headers(&[("retry-after", past)])),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn error_bodies_in_every_shape() {
        let openai = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            ProviderError::read(openai),
            ProviderError {
                message: Some("Rate limit reached".into()),
                kind: Some("requests".into()),
                code: Some("rate_limit_exceeded".into()),
            }
        );
        assert_eq!(
            ProviderError::read(br#"{"error":"model not found"}"#).message,
            Some("model not found".into())
        );
        assert_eq!(ProviderError::read(b"<html>"), ProviderError::default());
    }
}
