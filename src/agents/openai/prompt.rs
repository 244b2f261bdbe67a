//! What a task sends the model: the system prompt, the conversation's earlier turns
//! (bounded), and the new message, in the chat completions request body.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::config::OpenAiConfig;
use crate::protocol::model::{Message, Part, PartContent, Role, Task, TaskState};

/// One message of the chat, in the API's shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Turn {
    pub(super) role: &'static str,
    pub(super) content: String,
}

impl Turn {
    fn of(message: &Message) -> Turn {
        Turn {
            role: match message.role {
                Role::Agent => "assistant",
                Role::User | Role::Unspecified => "user",
            },
            // Parts of earlier turns were taken once; what cannot be read now is left out.
            content: content(&message.parts).unwrap_or_else(|_| message.text()),
        }
    }
}

/// A message's parts as the text the model reads, one part a line: text as it is, data as
/// JSON, files of a text type inlined under a line that names them. Anything else is
/// refused, with the reason the caller is given (-32602).
pub(super) fn content(parts: &[Part]) -> Result<String, String> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let at = format!("params.message.parts[{i}]");
        out.push(match &part.content {
            PartContent::Text(t) => t.clone(),
            PartContent::Data(v) => v.to_string(),
            PartContent::Url(_) => {
                return Err(format!(
                    "{at}: this agent does not fetch files by URL; send the file's bytes (a text type: {TEXT_TYPES})"
                ))
            }
            PartContent::Raw(b64) => {
                let media_type = part.media_type.as_deref().unwrap_or("");
                if !is_text_type(media_type) {
                    let what = match media_type {
                        "" => "a file without a mediaType".to_string(),
                        t => format!("a file of type {t}"),
                    };
                    return Err(format!(
                        "{at}: {what} cannot be sent to this agent's model; it takes text, data, and files of a text type ({TEXT_TYPES})"
                    ));
                }
                let text = decode(b64)
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or_else(|| format!("{at}: the file is not UTF-8 text"))?;
                let name = part.filename.as_deref().unwrap_or("file");
                format!("[{name} ({media_type})]\n{text}")
            }
        });
    }
    Ok(out.join("\n"))
}

const TEXT_TYPES: &str = "text/*, application/json, application/xml, application/yaml, application/toml, application/javascript, */*+json, */*+xml";

/// Media types whose bytes are text a model can read as it is.
fn is_text_type(media_type: &str) -> bool {
    let essence = media_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || essence.ends_with("+yaml")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/x-ndjson"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/javascript"
                | "application/x-sh"
                | "application/sql"
        )
}

/// Base64 as the protocol layer accepts it: either alphabet, padded or not.
fn decode(b64: &str) -> Option<Vec<u8>> {
    let lenient =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let trimmed = b64.trim();
    GeneralPurpose::new(&base64::alphabet::STANDARD, lenient)
        .decode(trimmed)
        .or_else(|_| GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient).decode(trimmed))
        .ok()
}

/// The chat: the system prompt, the earlier turns of the conversation (bounded, newest
/// kept), then the new message (`content`, its parts as read by [`content`]).
///
/// `earlier` are the context's earlier tasks, oldest first; only completed ones count
/// (a failed or canceled task's question was never answered). `current` is the task this
/// message continues, whose history ends with the message itself.
pub(super) fn turns(
    cfg: &OpenAiConfig,
    earlier: &[Task],
    current: Option<&Task>,
    message: &Message,
    content: String,
) -> Vec<Turn> {
    let mut past: Vec<Turn> = earlier
        .iter()
        .filter(|t| t.status.state == TaskState::Completed)
        .flat_map(|t| t.history.iter())
        .map(Turn::of)
        .collect();
    if let Some(task) = current {
        let mut own = task.history.as_slice();
        if let Some((last, before)) = own.split_last() {
            if last.message_id == message.message_id {
                own = before;
            }
        }
        past.extend(own.iter().map(Turn::of));
    }
    bound(&mut past, cfg.max_history_messages, cfg.max_history_tokens);
    let mut out = Vec::with_capacity(past.len() + 2);
    if let Some(prompt) = &cfg.system_prompt {
        out.push(Turn {
            role: "system",
            content: prompt.clone(),
        });
    }
    out.extend(past);
    out.push(Turn {
        role: "user",
        content,
    });
    out
}

/// Tokens a text costs, roughly: a token is about four characters of English.
pub(super) fn approx_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// Drops the oldest turns until at most `max_messages` are left and they cost at most
/// `max_tokens`.
fn bound(turns: &mut Vec<Turn>, max_messages: usize, max_tokens: usize) {
    let mut keep = 0;
    let mut tokens = 0usize;
    for turn in turns.iter().rev() {
        let cost = approx_tokens(&turn.content);
        if keep == max_messages || tokens.saturating_add(cost) > max_tokens {
            break;
        }
        tokens += cost;
        keep += 1;
    }
    let drop = turns.len() - keep;
    turns.drain(..drop);
}

/// The request body: the file's settings, its `extra` fields, and the chat.
pub(super) fn body(cfg: &OpenAiConfig, turns: &[Turn], streaming: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(cfg.model));
    body.insert("messages".into(), json!(turns));
    if let Some(t) = cfg.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = cfg.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    // The loader refused extra fields that would replace the gateway's own.
    for (k, v) in &cfg.extra {
        body.insert(k.clone(), v.clone());
    }
    body.insert("stream".into(), json!(streaming));
    if streaming {
        // The token counts come as one last chunk; servers that do not send it are fine.
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(role: &'static str, content: &str) -> Turn {
        Turn {
            role,
            content: content.into(),
        }
    }

    #[test]
    fn the_oldest_turns_go_first() {
        let all = vec![
            turn("user", "aaaa"),
            turn("assistant", "bbbbbbbb"),
            turn("user", "cccc"),
        ];
        let mut t = all.clone();
        bound(&mut t, 2, 100);
        assert_eq!(t, all[1..]);
        // "bbbbbbbb" costs 2, "cccc" 1: a budget of 2 keeps only the last.
        let mut t = all.clone();
        bound(&mut t, 10, 2);
        assert_eq!(t, all[2..]);
        let mut t = all.clone();
        bound(&mut t, 0, 100);
        assert!(t.is_empty());
        assert_eq!(approx_tokens("héllo"), 2);
    }

    fn task(state: TaskState, history: Vec<Message>) -> Task {
        let mut t = Task::submitted("t".into(), "c".into(), Message::default());
        t.status.state = state;
        t.history = history;
        t
    }

    fn said(role: Role, text: &str) -> Message {
        Message {
            message_id: format!("m-{text}"),
            role,
            parts: vec![Part::text(text)],
            ..Message::default()
        }
    }

    #[test]
    fn the_chat_is_the_prompt_the_answered_turns_and_the_message() {
        let cfg: OpenAiConfig = toml::from_str(
            "base_url = \"http://h/v1\"\nmodel = \"m\"\nsystem_prompt = \"Be brief.\"",
        )
        .unwrap();
        let earlier = [
            task(
                TaskState::Completed,
                vec![said(Role::User, "q1"), said(Role::Agent, "a1")],
            ),
            task(
                TaskState::Failed,
                vec![said(Role::User, "lost"), said(Role::Agent, "failed: x")],
            ),
        ];
        // A task continued after it asked something: its own turns, the message last.
        let now = said(Role::User, "q3");
        let current = task(
            TaskState::InputRequired,
            vec![
                said(Role::User, "q2"),
                said(Role::Agent, "which one?"),
                now.clone(),
            ],
        );
        let got = turns(&cfg, &earlier, Some(&current), &now, "q3".into());
        let want = [
            ("system", "Be brief."),
            ("user", "q1"),
            ("assistant", "a1"),
            ("user", "q2"),
            ("assistant", "which one?"),
            ("user", "q3"),
        ]
        .map(|(role, content)| turn(role, content));
        assert_eq!(got, want);
    }

    #[test]
    fn parts_are_read_or_refused() {
        let file = |media: Option<&str>, b64: &str| Part {
            content: PartContent::Raw(b64.into()),
            metadata: None,
            filename: Some("a.txt".into()),
            media_type: media.map(str::to_string),
        };
        let ok = content(&[
            Part::text("look:"),
            Part {
                content: PartContent::Data(json!({"k": 1})),
                metadata: None,
                filename: None,
                media_type: None,
            },
            file(Some("text/plain; charset=utf-8"), "aGk="),
        ])
        .unwrap();
        assert_eq!(
            ok,
            "look:\n{\"k\":1}\n[a.txt (text/plain; charset=utf-8)]\nhi"
        );
        let refused = content(&[Part::text("x"), file(Some("image/png"), "aGk=")]).unwrap_err();
        assert!(
            refused.starts_with("params.message.parts[1]: a file of type image/png"),
            "{refused}"
        );
        assert!(content(&[file(None, "aGk=")]).is_err());
        assert!(content(&[file(Some("text/plain"), "/w==")])
            .unwrap_err()
            .ends_with("not UTF-8 text"));
        for t in ["application/ld+json", "TEXT/markdown", "application/yaml"] {
            assert!(is_text_type(t), "{t}");
        }
        assert!(!is_text_type("application/pdf"));
    }
}
