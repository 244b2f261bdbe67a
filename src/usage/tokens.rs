//! Token counts as agents report them. The A2A specification has no field for usage; what
//! the SDKs and agent frameworks put in metadata (of a task, a status message, a status or
//! artifact event) is read here, in the shapes in use:
//!
//! - `usage`: the OpenAI shape (`prompt_tokens`, `completion_tokens`; the gateway's own LLM
//!   agents, LiteLLM, the inference gateway), or the Anthropic / redpanda one
//!   (`input_tokens`, `output_tokens`), or either in camelCase; the model beside it in
//!   `model` (or inside, in `usage.model`);
//! - `adk_usage_metadata` (Google ADK, one per model call; a JSON string in some versions),
//!   `kagent_usage_metadata` (kagent), `usage_metadata` / `usageMetadata`: Gemini's
//!   `promptTokenCount`, `candidatesTokenCount` (and `thoughtsTokenCount`, counted as
//!   output), the model in `adk_model_version` / `model_version` / `modelVersion`;
//!   an ADK event marked `adk_partial` repeats a later one and is skipped;
//! - `token_usage` / `tokenUsage`: either of the above.
//!
//! Only `total_tokens` (no split): counted as output.

use serde_json::{Map, Value};

/// One model's tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ModelTokens {
    pub(crate) model: String,
    pub(crate) input: u64,
    pub(crate) output: u64,
}

/// What a task reported, by model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) by_model: Vec<ModelTokens>,
}

impl Tokens {
    pub(crate) fn total(&self) -> u64 {
        self.by_model.iter().map(|m| m.input + m.output).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.total() == 0
    }

    pub(crate) fn add(&mut self, more: ModelTokens) {
        match self.by_model.iter_mut().find(|m| m.model == more.model) {
            Some(m) => {
                m.input += more.input;
                m.output += more.output;
            }
            None => self.by_model.push(more),
        }
    }

    /// Of two reports of one task's tokens (a total it carried, and what its events said
    /// one by one), the larger: neither counted twice, nor one left out.
    pub(crate) fn larger(self, other: Tokens) -> Tokens {
        match other.total() > self.total() {
            true => other,
            false => self,
        }
    }
}

/// The tokens one metadata object reports, if it reports any.
pub(crate) fn in_metadata(metadata: Option<&Map<String, Value>>) -> Option<ModelTokens> {
    let m = metadata?;
    if m.get("adk_partial").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let model = [
        "model",
        "adk_model_version",
        "model_version",
        "modelVersion",
        "model_name",
    ]
    .iter()
    .find_map(|k| m.get(*k).and_then(Value::as_str));
    for key in [
        "usage",
        "adk_usage_metadata",
        "kagent_usage_metadata",
        "usage_metadata",
        "usageMetadata",
        "token_usage",
        "tokenUsage",
    ] {
        let Some(value) = m.get(key) else { continue };
        // ADK versions that serialize it as a string.
        let parsed;
        let value = match value {
            Value::String(text) => {
                let Ok(v) = serde_json::from_str::<Value>(text) else {
                    continue;
                };
                parsed = v;
                &parsed
            }
            v => v,
        };
        let Some(usage) = value.as_object() else {
            continue;
        };
        if let Some(mut found) = counts(usage) {
            let inner = usage.get("model").and_then(Value::as_str);
            found.model = inner.or(model).unwrap_or_default().to_string();
            return Some(found);
        }
    }
    None
}

fn counts(u: &Map<String, Value>) -> Option<ModelTokens> {
    let n = |keys: &[&str]| keys.iter().find_map(|k| u.get(*k).and_then(Value::as_u64));
    let input = n(&[
        "prompt_tokens",
        "input_tokens",
        "promptTokens",
        "inputTokens",
        "promptTokenCount",
        "prompt_token_count",
    ]);
    let output = n(&[
        "completion_tokens",
        "output_tokens",
        "completionTokens",
        "outputTokens",
        "candidatesTokenCount",
        "candidates_token_count",
    ]);
    let thoughts = n(&["thoughtsTokenCount", "thoughts_token_count"]).unwrap_or(0);
    let total = n(&[
        "total_tokens",
        "totalTokens",
        "totalTokenCount",
        "total_token_count",
    ]);
    match (input, output, total) {
        (None, None, None) => None,
        (None, None, Some(total)) => Some(ModelTokens {
            output: total,
            ..Default::default()
        }),
        (input, output, _) => Some(ModelTokens {
            model: String::new(),
            input: input.unwrap_or(0),
            output: output.unwrap_or(0) + thoughts,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Option<ModelTokens> {
        in_metadata(v.as_object())
    }

    #[test]
    fn the_shapes_in_use_are_read() {
        let openai = read(
            json!({"model": "gpt-4o-mini", "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}),
        );
        assert_eq!(
            openai,
            Some(ModelTokens {
                model: "gpt-4o-mini".into(),
                input: 12,
                output: 30
            })
        );
        let anthropic =
            read(json!({"usage": {"input_tokens": 5, "output_tokens": 7, "model": "claude"}}));
        assert_eq!(
            anthropic.map(|t| (t.model, t.input, t.output)),
            Some(("claude".into(), 5, 7))
        );
        let adk = read(json!({
            "adk_usage_metadata": {"promptTokenCount": 100, "candidatesTokenCount": 20, "thoughtsTokenCount": 5, "totalTokenCount": 125},
            "adk_model_version": "gemini-2.5-flash"
        }));
        assert_eq!(
            adk.map(|t| (t.model, t.input, t.output)),
            Some(("gemini-2.5-flash".into(), 100, 25))
        );
        let adk_text = read(
            json!({"adk_usage_metadata": "{\"promptTokenCount\": 3, \"candidatesTokenCount\": 4}"}),
        );
        assert_eq!(adk_text.map(|t| (t.input, t.output)), Some((3, 4)));
        let partial =
            read(json!({"adk_partial": true, "adk_usage_metadata": {"promptTokenCount": 3}}));
        assert_eq!(partial, None);
        let kagent = read(
            json!({"kagent_usage_metadata": {"promptTokenCount": 1, "candidatesTokenCount": 2}}),
        );
        assert_eq!(kagent.map(|t| (t.input, t.output)), Some((1, 2)));
        let camel = read(json!({"tokenUsage": {"inputTokens": 8, "outputTokens": 9}}));
        assert_eq!(camel.map(|t| (t.input, t.output)), Some((8, 9)));
        let total_only = read(json!({"usage": {"total_tokens": 50}}));
        assert_eq!(total_only.map(|t| (t.input, t.output)), Some((0, 50)));
        assert_eq!(read(json!({"usage": "lots"})), None);
        assert_eq!(read(json!({"other": 1})), None);
    }

    #[test]
    fn of_two_reports_the_larger_counts() {
        let mut events = Tokens::default();
        events.add(ModelTokens {
            model: "m".into(),
            input: 10,
            output: 5,
        });
        events.add(ModelTokens {
            model: "m".into(),
            input: 10,
            output: 5,
        });
        let total = Tokens {
            by_model: vec![ModelTokens {
                model: "m".into(),
                input: 20,
                output: 10,
            }],
        };
        assert_eq!(events.clone().larger(total.clone()).total(), 30);
        assert_eq!(Tokens::default().larger(total).total(), 30);
    }
}
