//! The shapes of A2A operations, independent of dialect and transport: what the service
//! takes and returns, whichever backend (local or upstream) answers.

use std::pin::Pin;

use futures_util::Stream;
use serde::ser::SerializeMap;
use serde::Serialize;

use super::model::{Message, StreamItem, Task};
use super::relay::Relayed;
use crate::error::GatewayError;

/// An item of an [`ItemStream`], with the version its task had once it was applied, where
/// the gateway keeps the task's events (its own tasks; none for an upstream's).
pub type Positioned = Result<(StreamItem, Option<u64>), GatewayError>;

/// A stream of task events in order; ends after the item that closes it. Read as a stream
/// of items; [`ItemStream::positioned`] also gives each one's place among its task's
/// events, which a resumable stream (SSE) sends as the event's id.
pub struct ItemStream(Pin<Box<dyn Stream<Item = Positioned> + Send>>);

impl ItemStream {
    /// Items whose place is not known.
    pub fn new(
        items: impl Stream<Item = Result<StreamItem, GatewayError>> + Send + 'static,
    ) -> Self {
        use futures_util::StreamExt;
        ItemStream(Box::pin(items.map(|r| r.map(|item| (item, None)))))
    }

    /// Items with their place.
    pub fn positioned(items: impl Stream<Item = Positioned> + Send + 'static) -> Self {
        ItemStream(Box::pin(items))
    }

    /// The items, each with its place.
    pub fn with_positions(self) -> Pin<Box<dyn Stream<Item = Positioned> + Send>> {
        self.0
    }

    /// Changes each item (and keeps its place).
    pub fn map_items(
        self,
        mut f: impl FnMut(Result<StreamItem, GatewayError>) -> Result<StreamItem, GatewayError>
            + Send
            + 'static,
    ) -> Self {
        use futures_util::StreamExt;
        ItemStream(Box::pin(self.0.map(move |r| match r {
            Ok((item, at)) => f(Ok(item)).map(|item| (item, at)),
            Err(e) => f(Err(e)).map(|item| (item, None)),
        })))
    }
}

impl Stream for ItemStream {
    type Item = Result<StreamItem, GatewayError>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0
            .as_mut()
            .poll_next(cx)
            .map(|o| o.map(|r| r.map(|(item, _)| item)))
    }
}

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
    /// Told the id of the task the send starts once its agent's actor has stored it, before
    /// the send answers (a gateway's own agent). Not told of a task answered at once, or of
    /// an upstream's: the answer names those.
    pub on_new_task: Option<OnNewTask>,
}

/// See [`SendRequest::on_new_task`]: a 0.1 client's name for its task is recorded then, so
/// that the client can ask after the task by that name while its blocking send waits.
#[derive(Clone)]
pub struct OnNewTask(pub std::sync::Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for OnNewTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnNewTask")
    }
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
