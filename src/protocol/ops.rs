//! The shapes of A2A operations, independent of dialect and transport: what the service
//! takes and returns, whichever backend (local or upstream) answers.

use std::pin::Pin;

use futures_util::Stream;
use serde::ser::SerializeMap;
use serde::Serialize;

use super::model::{Message, StreamItem, Task};
use super::relay::Relayed;
use crate::error::GatewayError;

/// A stream of task events in order; ends after the item that closes it.
pub type ItemStream = Pin<Box<dyn Stream<Item = Result<StreamItem, GatewayError>> + Send>>;

/// A send, checked and ready to run.
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub message: Message,
    pub blocking: bool,
    pub history_length: Option<usize>,
    pub accepted_output_modes: Vec<String>,
    pub metadata: Option<super::model::Metadata>,
    /// A push notification config given with the send, for the task it starts.
    /// Boxed: a send is moved through several layers, and almost none has one.
    pub push: Option<Box<super::push::PushConfig>>,
    /// The dialect the answer goes out in: an upstream speaking it too is relayed as is.
    pub reply_dialect: super::Dialect,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksResponse {
    pub tasks: Vec<Task>,
    pub next_page_token: String,
    pub page_size: usize,
    pub total_size: usize,
}

/// What a send returns: the 1.0 `SendMessageResponse` oneof.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    Task(Task),
    Message(Message),
    /// An upstream's answer, already in the caller's dialect (see [`Relayed`]).
    /// Boxed: the largest answer by far, which would make every send's answer as large
    /// (and copied as often).
    Relayed(Box<Relayed>),
}

impl Serialize for SendResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        fn wrapped<S: serde::Serializer, T: Serialize>(
            s: S,
            key: &str,
            value: &T,
        ) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry(key, value)?;
            map.end()
        }
        match self {
            SendResult::Task(t) => wrapped(s, "task", t),
            SendResult::Message(m) => wrapped(s, "message", m),
            SendResult::Relayed(r) => r.serialize_as(super::Dialect::V10, s),
        }
    }
}
