//! The common send read without serde: `SendMessage` or `message/send` (or their streaming
//! forms) carrying a text message, which is what nearly every call is. serde's derived
//! visitors cost an agent's own endpoint more than anything else it does for such a call;
//! this reader walks the bytes once and builds the same values.
//!
//! It takes only what it reads exactly as serde would: plain strings (no escapes), small
//! unsigned integers, the members listed below, each once. Anything else (an escape, a
//! member it does not know, a file part, a null) gives None and serde reads the body, so
//! every body gets serde's answer. The `jsonrpc_envelope` fuzz target and the tests below
//! hold the two readers to that.

use serde_json::Value;

use super::model::{Message, Part, Role};
use super::params::{SendConfiguration, SendParams};
use super::scan::next_special;

/// A send read, with what `send_method` made of its method name.
pub(super) struct CommonSend<M> {
    pub(super) id: Value,
    pub(super) method: M,
    pub(super) params: Box<SendParams>,
}

/// The request, when it has the common shape and `send_method` takes its method name as
/// a send; None sends it to serde.
pub(super) fn read<M>(
    text: &str,
    send_method: impl Fn(&str) -> Option<M>,
) -> Option<CommonSend<M>> {
    let mut c = Cursor { text, at: 0 };
    let (mut version, mut id, mut method, mut params) = (None, None, None, None);
    c.object(|c, key| match key {
        "jsonrpc" => once(&mut version, c.plain().filter(|v| *v == "2.0")),
        "id" => {
            let value = match c.peek()? {
                b'"' => c.string().map(Value::String),
                _ => c.small_uint().map(Value::from),
            };
            once(&mut id, value)
        }
        "method" => once(&mut method, c.plain().and_then(&send_method)),
        // After the method, as serde's one-pass reader needs it.
        "params" if method.is_some() => once(&mut params, send_params(c)),
        _ => None,
    })?;
    c.end()?;
    version?;
    Some(CommonSend {
        id: id?,
        method: method?,
        params: params?,
    })
}

/// Fills `slot` with `value`, unless it is filled already: serde refuses a member given
/// twice. None (leave the body to serde) then, or when there is no value.
fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

fn send_params(c: &mut Cursor<'_>) -> Option<Box<SendParams>> {
    let (mut message, mut configuration) = (None, None);
    c.object(|c, key| match key {
        "message" => once(&mut message, self::message(c)),
        "configuration" => once(&mut configuration, self::configuration(c)),
        _ => None,
    })?;
    Some(Box::new(SendParams {
        message: message?,
        configuration,
        metadata: None,
        session_id: None,
    }))
}

fn message(c: &mut Cursor<'_>) -> Option<Message> {
    let (mut message_id, mut context_id, mut task_id) = (None, None, None);
    let (mut role, mut parts, mut kind) = (None, None, None);
    c.object(|c, key| match key {
        "messageId" => once(&mut message_id, c.string()),
        "contextId" => once(&mut context_id, c.string()),
        "taskId" => once(&mut task_id, c.string()),
        "role" => once(&mut role, c.plain().and_then(Role::from_name)),
        "parts" => once(&mut parts, c.list(text_part)),
        // 0.3 says what the object is; serde ignores it.
        "kind" => once(&mut kind, c.plain().filter(|k| *k == "message")),
        _ => None,
    })?;
    Some(Message {
        message_id: message_id?,
        context_id,
        task_id,
        role: role?,
        parts: parts?,
        metadata: None,
        extensions: Vec::new(),
        reference_task_ids: Vec::new(),
    })
}

fn text_part(c: &mut Cursor<'_>) -> Option<Part> {
    let (mut text, mut kind) = (None, None);
    c.object(|c, key| match key {
        "text" => once(&mut text, c.plain()),
        "kind" => once(&mut kind, c.plain().filter(|k| *k == "text")),
        _ => None,
    })?;
    Some(Part::text(text?))
}

fn configuration(c: &mut Cursor<'_>) -> Option<SendConfiguration> {
    let (mut modes, mut history_length, mut blocking, mut immediately) = (None, None, None, None);
    c.object(|c, key| match key {
        "acceptedOutputModes" => once(&mut modes, c.list(Cursor::string)),
        "historyLength" => once(
            &mut history_length,
            c.small_uint().and_then(|n| i64::try_from(n).ok()),
        ),
        "blocking" => once(&mut blocking, c.boolean()),
        "returnImmediately" => once(&mut immediately, c.boolean()),
        _ => None,
    })?;
    Some(SendConfiguration {
        accepted_output_modes: modes.unwrap_or_default(),
        history_length,
        blocking,
        return_immediately: immediately,
        push_notification_config: None,
    })
}

struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte after JSON whitespace.
    fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
        self.bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Only whitespace is left.
    fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// A string with no escapes (whose text is its value).
    fn plain(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let end = next_special(self.bytes(), start)?;
        (self.bytes()[end] == b'"').then_some(())?;
        self.at = end + 1;
        // Both ends are next to an ASCII quote, so on character boundaries.
        self.text.get(start..end)
    }

    fn string(&mut self) -> Option<String> {
        self.plain().map(str::to_string)
    }

    /// An unsigned integer of at most 18 digits (so it fits any integer type serde would
    /// read it into); a fraction or an exponent after it fails the caller's next step.
    fn small_uint(&mut self) -> Option<u64> {
        self.peek()?;
        let digits = self.bytes()[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        // JSON has no leading zeros: "0" stands alone, and "01" stops after the 0.
        let digits = match self.bytes()[self.at] {
            b'0' => 1,
            _ => digits,
        };
        if digits == 0 || digits > 18 {
            return None;
        }
        let value = self.bytes()[self.at..self.at + digits]
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        self.at += digits;
        Some(value)
    }

    fn boolean(&mut self) -> Option<bool> {
        self.peek()?;
        let rest = &self.bytes()[self.at..];
        let (value, len) = match () {
            () if rest.starts_with(b"true") => (true, 4),
            () if rest.starts_with(b"false") => (false, 5),
            () => return None,
        };
        self.at += len;
        Some(value)
    }

    /// An object whose keys are plain strings, each member read by `member`, which fails
    /// for a key it does not take.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.plain()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array, each item read by `item`.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        // Most lists here hold one item (a message's one text part): sized for it, so the
        // first push does not go through the growth path.
        let mut out = Vec::with_capacity(1);
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::jsonrpc::parse_request;
    use crate::protocol::params;

    /// What serde makes of a send: id, method, dialect and params, as text.
    fn by_serde(body: &str) -> String {
        let r = parse_request(body.as_bytes(), None).expect("serde reads it");
        let p: SendParams = params::decode(r.params).expect("serde decodes the params");
        format!("{:?} {:?} {:?} {p:?}", r.id, r.method, r.dialect)
    }

    fn by_this(body: &str) -> Option<String> {
        let r = read(body, crate::protocol::jsonrpc::send_method)?;
        let (method, dialect) = r.method;
        Some(format!(
            "{:?} {method:?} {dialect:?} {:?}",
            crate::protocol::jsonrpc::RpcId::Value(r.id),
            r.params
        ))
    }

    #[test]
    fn reads_the_common_sends_as_serde_does() {
        let bodies = [
            r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m1","parts":[{"text":"hello"}]}}}"#,
            r#"{"jsonrpc":"2.0","id":"req-7","method":"message/send","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[{"kind":"text","text":"hé 😀 DEL"}],"contextId":"c","taskId":"t"}}}"#,
            "{ \"method\" : \"SendStreamingMessage\" ,\n\t\"id\" : 0 , \"jsonrpc\" : \"2.0\" , \"params\" : { \"configuration\" : { \"acceptedOutputModes\" : [ \"text/plain\" , \"application/json\" ] , \"historyLength\" : 3 , \"blocking\" : false , \"returnImmediately\" : true } , \"message\" : { \"parts\" : [ ] , \"role\" : \"agent\" , \"messageId\" : \"\" } } }\n",
            r#"{"jsonrpc":"2.0","id":123456789012345678,"method":"message/stream","params":{"message":{"role":"ROLE_UNSPECIFIED","messageId":"m","parts":[{"text":"a"},{"text":"b"},{"kind":"text","text":""}]},"configuration":{"acceptedOutputModes":[],"blocking":true}}}"#,
        ];
        let del = bodies[1].replace("DEL", "\u{7f}");
        for body in bodies.iter().copied().chain([del.as_str()]) {
            assert_eq!(
                by_this(body).as_deref(),
                Some(by_serde(body).as_str()),
                "{body}"
            );
        }
    }

    #[test]
    fn leaves_everything_else_to_serde() {
        let send = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{params}}}"#)
        };
        let msg = |members: &str| send(&format!(r#"{{"message":{{{members}}}}}"#));
        let ok = r#""role":"ROLE_USER","messageId":"m1","parts":[{"text":"hello"}]"#;
        let declined = [
            msg(r#""role":"ROLE_USER","messageId":"m1","parts":[{"text":"a\"b"}]"#),
            msg(r#""role":"ROLE_USER","messageId":"m\u0031","parts":[{"text":"a"}]"#),
            msg(r#""role":"ROLE_USER","messageId":"m1","parts":[{"url":"http://x"}]"#),
            msg(r#""role":"ROLE_USER","messageId":"m1","parts":[{"kind":"data","text":"a"}]"#),
            msg(
                r#""role":"ROLE_USER","messageId":"m1","parts":[{"text":"a","kind":"text","kind":"text"}]"#,
            ),
            msg(r#""role":"ROLE_USER","messageId":"m1","messageId":"m2","parts":[]"#),
            msg(r#""role":"robot","messageId":"m1","parts":[]"#),
            msg(r#""role":"ROLE_USER","messageId":"m1","parts":[],"metadata":{}"#),
            msg(r#""role":"ROLE_USER","messageId":"m1","parts":[],"contextId":null"#),
            msg(r#""role":"ROLE_USER","parts":[]"#),
            msg(r#""role":"ROLE_USER","messageId":"m1","parts":[],"kind":"task""#),
            msg(&format!("{ok},")),
            send(&format!(r#"{{"message":{{{ok}}},"metadata":{{}}}}"#)),
            send(&format!(r#"{{"message":{{{ok}}},"configuration":null}}"#)),
            send(&format!(
                r#"{{"message":{{{ok}}},"configuration":{{"historyLength":null}}}}"#
            )),
            send(&format!(
                r#"{{"message":{{{ok}}},"configuration":{{"historyLength":1.5}}}}"#
            )),
            send(&format!(
                r#"{{"message":{{{ok}}},"configuration":{{"blocking":true,"blocking":false}}}}"#
            )),
            send(&format!(
                r#"{{"message":{{{ok}}},"configuration":{{"pushNotificationConfig":{{}}}}}}"#
            )),
            send(&format!(r#"{{"message":{{{ok}}},"sessionId":"s"}}"#)),
            send(&format!(r#"{{"message":{{{ok}}}}} x"#)),
            send(&format!(r#"{{"message":{{{ok}}}"#)),
            send("[]"),
        ];
        let head = |id: &str, method: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"message":{{{ok}}}}}}}"#
            )
        };
        let mut declined = declined.to_vec();
        for id in [
            "1.5",
            "-1",
            "null",
            "01",
            "1e3",
            "1234567890123456789",
            "\"a\\nb\"",
        ] {
            declined.push(head(id, "SendMessage"));
        }
        for method in ["tasks/send", "GetTask", "message/send\\u0000", "Nope"] {
            declined.push(head("1", method));
        }
        declined.push(head("1", "SendMessage").replace("2.0", "1.0"));
        declined.push(head("1", "SendMessage").replace(r#""id":1,"#, r#""id":1,"x":0,"#));
        declined.push(format!(
            r#"{{"jsonrpc":"2.0","id":1,"params":{{"message":{{{ok}}}}},"method":"SendMessage"}}"#
        ));
        for body in &declined {
            assert!(by_this(body).is_none(), "should be left to serde: {body}");
        }
        // And the check itself: the common form is taken.
        assert!(by_this(&head("1", "SendMessage")).is_some());
        assert!(by_this(&msg(ok)).is_some());
    }
}
