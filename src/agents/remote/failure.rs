//! Why a call to a remote agent got no answer, and the capped read of an answer's body:
//! shared by the connections ([`Pool`](super::pool::Pool)), the calls made over them
//! ([`Transport`](super::transport::Transport)), streams and gRPC, so that each maps a
//! failure alike and none imports another for it.

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// Why a call got no answer. Shared with the reqwest paths so both map failures alike.
#[derive(Debug)]
pub(super) enum Failure {
    Timeout,
    /// No connection could be made; `refused` when the remote actively said no.
    Connect {
        refused: bool,
        detail: String,
    },
    /// The connection broke before a whole answer arrived.
    Broken(String),
    /// The answer was longer than [`MAX_ANSWER_BYTES`]; the rest was not read.
    TooLarge,
}

/// The longest unary answer read from a remote. Nothing in A2A needs more, and without a
/// bound a broken remote could make the gateway buffer until it runs out of memory.
pub(super) const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

impl Failure {
    pub(super) fn detail(&self) -> String {
        match self {
            Failure::Timeout => "timed out".into(),
            Failure::TooLarge => format!("answered with more than {MAX_ANSWER_BYTES} bytes"),
            Failure::Connect { detail, .. } | Failure::Broken(detail) => detail.clone(),
        }
    }

    pub(super) fn from_reqwest(e: &reqwest::Error) -> Failure {
        if e.is_timeout() {
            Failure::Timeout
        } else {
            Failure::classify(e, e.is_connect())
        }
    }

    pub(super) fn classify(e: &(dyn std::error::Error + 'static), connecting: bool) -> Failure {
        if connecting {
            connect_failure(e)
        } else {
            Failure::Broken(root_cause(e))
        }
    }
}

fn connect_failure(e: &(dyn std::error::Error + 'static)) -> Failure {
    let mut refused = false;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        refused |= err.to_string().to_ascii_lowercase().contains("refused");
        cur = err.source();
    }
    Failure::Connect {
        refused,
        detail: root_cause(e),
    }
}

/// The innermost error message (reqwest and hyper wrap io errors several levels deep).
pub(super) fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A whole answer body, or [`Failure::TooLarge`] once it passes [`MAX_ANSWER_BYTES`].
pub(super) async fn read_capped<B>(body: B) -> Result<Bytes, Failure>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match Limited::new(body, MAX_ANSWER_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Failure::TooLarge),
        Err(e) => Err(Failure::Broken(root_cause(&*e))),
    }
}
