//! Reading request bodies: content type, size, time and memory checks that answer in the
//! protocol.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use bytes::{Bytes, BytesMut};

use futures_util::{FutureExt, Stream, StreamExt};

use crate::config::Limits;
use crate::error::GatewayError;

/// JSON-RPC travels as `application/json`; `application/a2a+json` and other `+json` types are
/// accepted too. A body with no Content-Type is refused: a browser sends one cross-origin
/// without asking first (a `no-cors` fetch of an untyped Blob), as it does the form types
/// (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`), so a page on
/// any origin could otherwise run tasks on public agents. A JSON type always takes a
/// preflight, which CORS answers.
pub(super) fn check_content_type(req: &HttpRequest) -> Result<(), GatewayError> {
    check_json_type(req, "application/json (or application/a2a+json)")
}

/// The body's Content-Type is JSON (`application/json` or any `+json` type); otherwise the
/// error names what was sent and asks for `send_as`.
pub(crate) fn check_json_type(req: &HttpRequest, send_as: &str) -> Result<(), GatewayError> {
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else {
        return Err(GatewayError::ContentTypeNotSupported(format!(
            "none given; send the body as {send_as}"
        )));
    };
    let raw = value.as_bytes();
    let essence = raw.split(|b| *b == b';').next().unwrap_or(raw).trim_ascii();
    let json = essence.eq_ignore_ascii_case(b"application/json")
        || (essence.len() >= 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json"));
    if json {
        Ok(())
    } else {
        let essence = String::from_utf8_lossy(essence).to_ascii_lowercase();
        Err(GatewayError::ContentTypeNotSupported(format!(
            "\"{essence}\"; send the body as {send_as}"
        )))
    }
}

/// [`check_content_type`] for a POST that needs no body (an HTTP+JSON cancel or
/// subscribe): one sent with a body, or with a Content-Type, must be JSON all the same.
pub(super) fn check_bodiless_post(req: &HttpRequest) -> Result<(), GatewayError> {
    let headers = req.headers();
    let empty = !headers.contains_key(header::TRANSFER_ENCODING)
        && headers
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0");
    match empty && !headers.contains_key(header::CONTENT_TYPE) {
        true => Ok(()),
        false => check_content_type(req),
    }
}

/// Who pays for a body still arriving: a keyed hash of the caller (its credential, or its
/// address when anonymous), and whether it is anonymous.
pub(crate) struct Payer<'a> {
    pub(crate) hash: &'a dyn Fn(&ahash::RandomState) -> u64,
    pub(crate) anonymous: bool,
}

/// What a body may cost: its size, its time, and its share of the bytes held gateway-wide
/// for bodies still arriving (so slow senders cannot hold the gateway's memory), of which
/// one caller may hold only a part (so one sender cannot hold it all), and anonymous
/// callers together another (so any number of addresses cannot take what callers with
/// credentials are owed).
pub(crate) struct BodyLimits {
    max_bytes: usize,
    base_time: Duration,
    min_rate: usize,
    budget: usize,
    buffered: AtomicUsize,
    /// Bytes anonymous callers' bodies still arriving hold, and the most they may.
    anonymous: AtomicUsize,
    anonymous_budget: usize,
    per_caller: usize,
    /// Bytes held per caller, in slots chosen by a keyed hash of the caller: no map to
    /// lock, no key to allocate. Callers whose keys share a slot share its allowance,
    /// which errs toward refusing; the random key keeps anyone from choosing a slot.
    by_caller: Box<[AtomicUsize]>,
    slot_of: ahash::RandomState,
}

const CALLER_SLOTS: usize = 4096;

impl BodyLimits {
    /// The largest body (or gRPC message) a call may send.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub(crate) fn new(limits: &Limits) -> BodyLimits {
        let budget = limits.max_buffered_body_bytes;
        BodyLimits {
            max_bytes: limits.max_body_bytes,
            base_time: Duration::from_secs(limits.body_timeout_secs.max(1)),
            min_rate: limits.body_min_bytes_per_sec.max(1),
            budget,
            buffered: AtomicUsize::new(0),
            anonymous: AtomicUsize::new(0),
            anonymous_budget: limits
                .max_buffered_body_bytes_anonymous
                .unwrap_or(budget / 2)
                .max(1),
            per_caller: limits
                .max_buffered_body_bytes_per_caller
                .unwrap_or(budget / 8)
                .max(1),
            by_caller: (0..CALLER_SLOTS).map(|_| AtomicUsize::new(0)).collect(),
            slot_of: ahash::RandomState::new(),
        }
    }

    /// Bytes held right now for bodies still arriving.
    pub(crate) fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Acquire)
    }

    /// Takes `n` more bytes of the budget, or refuses.
    fn reserve(&self, held: &mut Held<'_>, n: usize) -> Result<(), GatewayError> {
        let before = self.buffered.fetch_add(n, Ordering::AcqRel);
        if before + n > self.budget {
            self.buffered.fetch_sub(n, Ordering::AcqRel);
            return Err(GatewayError::BodiesOverBudget);
        }
        held.bytes += n;
        Ok(())
    }

    fn slot_index(&self, caller: &Payer<'_>) -> usize {
        (caller.hash)(&self.slot_of) as usize % CALLER_SLOTS
    }

    /// Takes `n` bytes of the caller's share for something it keeps open (an MCP session)
    /// beside its bodies, or refuses past the share; what to give back with
    /// [`Self::give_back`].
    pub(crate) fn hold_share(&self, caller: &Payer<'_>, n: usize) -> Result<usize, GatewayError> {
        let slot = self.slot_index(caller);
        let mut held = CallerHeld {
            slot: &self.by_caller[slot],
            bytes: 0,
            max: self.per_caller,
        };
        held.grow_to(n)?;
        held.keep();
        Ok(slot)
    }

    /// Gives back what [`Self::hold_share`] took.
    pub(crate) fn give_back(&self, slot: usize, n: usize) {
        if let Some(slot) = self.by_caller.get(slot) {
            slot.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// What a body still arriving from an anonymous caller holds of the anonymous callers'
/// part of the budget, given back with it.
struct AnonymousHeld<'a> {
    limits: &'a BodyLimits,
    bytes: usize,
}

impl AnonymousHeld<'_> {
    fn grow_to(&mut self, total: usize) -> Result<(), GatewayError> {
        let more = total.saturating_sub(self.bytes);
        if more == 0 {
            return Ok(());
        }
        let pool = &self.limits.anonymous;
        let before = pool.fetch_add(more, Ordering::AcqRel);
        if before + more > self.limits.anonymous_budget {
            pool.fetch_sub(more, Ordering::AcqRel);
            return Err(GatewayError::AnonymousBodiesOverBudget(
                crate::config::bytes_text(self.limits.anonymous_budget as u64),
            ));
        }
        self.bytes = total;
        Ok(())
    }
}

impl Drop for AnonymousHeld<'_> {
    fn drop(&mut self) {
        self.limits
            .anonymous
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A body's reservation, given back when the body is read (or given up).
struct Held<'a> {
    limits: &'a BodyLimits,
    bytes: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.limits.buffered.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What a body still arriving holds of its caller's share, given back with it.
struct CallerHeld<'a> {
    slot: &'a AtomicUsize,
    bytes: usize,
    max: usize,
}

impl CallerHeld<'_> {
    /// Counts the body's bytes up to `total`, or refuses past the caller's share.
    fn grow_to(&mut self, total: usize) -> Result<(), GatewayError> {
        let more = total.saturating_sub(self.bytes);
        if more == 0 {
            return Ok(());
        }
        let before = self.slot.fetch_add(more, Ordering::AcqRel);
        if before + more > self.max {
            self.slot.fetch_sub(more, Ordering::AcqRel);
            return Err(GatewayError::BodiesOverShare(crate::config::bytes_text(
                self.max as u64,
            )));
        }
        self.bytes = total;
        Ok(())
    }
}

impl CallerHeld<'_> {
    /// Leaves what it holds held when it goes: [`BodyLimits::give_back`] gives it back.
    fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for CallerHeld<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What has arrived of a body. Most come in one chunk, which is then the body as it came,
/// with no buffer to fill.
#[derive(Default)]
enum Arrived {
    #[default]
    Nothing,
    One(Bytes),
    Gathered(BytesMut),
}

/// A body being read: what has arrived, and what it holds of the budgets.
struct Reading<'a> {
    arrived: Arrived,
    /// What the buffer is sized for once a second chunk needs one: the declared length,
    /// if any.
    expected: usize,
    limit: usize,
    held: Held<'a>,
    caller: Option<CallerHeld<'a>>,
    anonymous: Option<AnonymousHeld<'a>>,
}

impl Reading<'_> {
    /// Takes every chunk there is now; whether the body is all there.
    fn drain<S, E>(&mut self, body: &mut S) -> Result<bool, GatewayError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        loop {
            match body.next().now_or_never() {
                Some(Some(chunk)) => self.take(chunk)?,
                Some(None) => return Ok(true),
                None => return Ok(false),
            }
        }
    }

    fn take<E: std::fmt::Display>(&mut self, chunk: Result<Bytes, E>) -> Result<(), GatewayError> {
        let chunk = chunk
            .map_err(|e| GatewayError::InvalidRequest(format!("could not read the body: {e}")))?;
        let total = self.len() + chunk.len();
        if total > self.limit {
            return Err(GatewayError::PayloadTooLarge(self.limit));
        }
        let more = total.saturating_sub(self.held.bytes);
        if more > 0 {
            self.held.limits.reserve(&mut self.held, more)?;
        }
        if let Some(caller) = &mut self.caller {
            caller.grow_to(self.held.bytes)?;
        }
        if let Some(anonymous) = &mut self.anonymous {
            anonymous.grow_to(self.held.bytes)?;
        }
        self.arrived = match std::mem::take(&mut self.arrived) {
            Arrived::Nothing => Arrived::One(chunk),
            Arrived::One(first) => {
                let mut buf = BytesMut::with_capacity(total.max(self.expected));
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&chunk);
                Arrived::Gathered(buf)
            }
            Arrived::Gathered(mut buf) => {
                buf.extend_from_slice(&chunk);
                Arrived::Gathered(buf)
            }
        };
        Ok(())
    }

    fn len(&self) -> usize {
        match &self.arrived {
            Arrived::Nothing => 0,
            Arrived::One(b) => b.len(),
            Arrived::Gathered(b) => b.len(),
        }
    }

    /// The body read.
    fn into_body(self) -> Bytes {
        match self.arrived {
            Arrived::Nothing => Bytes::new(),
            Arrived::One(b) => b,
            Arrived::Gathered(b) => b.freeze(),
        }
    }
}

/// Reads the body: refused at once when its declared size is over the limit or the
/// gateway's budget, refused as soon as it grows past either, and given up with 408 when it
/// has not arrived within `body_timeout_secs` plus a second per `body_min_bytes_per_sec`.
/// A body that is not all there at once counts against its caller's share from then on,
/// and an anonymous caller's against the anonymous callers' part of the budget; one that
/// came with its head (most do) pays for no account.
pub(crate) fn read_body<'a>(
    req: &HttpRequest,
    body: web::Payload,
    limits: &'a BodyLimits,
    caller: &'a Payer<'a>,
) -> impl std::future::Future<Output = Result<Bytes, GatewayError>> + 'a {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let body = body.into_inner();
    let feeding = match body {
        actix_web::dev::Payload::H1 { .. } => Feeding::PolledAfterReads,
        _ => Feeding::Woken,
    };
    // The reader's own future, not one around it: this is every JSON call's path.
    read_chunks(body, declared, limits.max_bytes, limits, caller, feeding)
}

/// How the server brings a call waiting for its body back when more of it comes.
#[derive(Clone, Copy)]
pub(crate) enum Feeding {
    /// actix-http's HTTP/1 dispatcher polls the call in flight again after every read it
    /// makes, wake or no wake.
    PolledAfterReads,
    /// Only a wake does (hyper's HTTP/2 for gRPC, actix-http's HTTP/2).
    Woken,
}

/// [`read_body`] for a body that comes as any stream of chunks (a gRPC call's HTTP/2
/// body), `declared` long if its head says, at most `limit` bytes, fed as `feeding` says.
pub(crate) async fn read_chunks<S, E>(
    mut body: S,
    declared: Option<usize>,
    limit: usize,
    limits: &BodyLimits,
    caller: &Payer<'_>,
    feeding: Feeding,
) -> Result<Bytes, GatewayError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::PayloadTooLarge(limit));
    }
    let mut reading = Reading {
        arrived: Arrived::Nothing,
        expected: declared.unwrap_or(1024).min(limit),
        limit,
        held: Held { limits, bytes: 0 },
        caller: None,
        anonymous: None,
    };
    // A declared length is taken whole up front: a sender cannot start many bodies cheaply.
    if let Some(n) = declared {
        limits.reserve(&mut reading.held, n)?;
    }
    if reading.drain(&mut body)? {
        return Ok(reading.into_body());
    }
    let expected = declared.unwrap_or(limit);
    let deadline = limits.base_time + Duration::from_secs((expected / limits.min_rate) as u64);
    let mut timer = std::pin::pin!(None::<tokio::time::Sleep>);
    // One wait before the caller's account: a body that came with its head is fed as soon
    // as the handler first waits, and returns in the same turn.
    let mut waited = false;
    match feeding {
        // The dispatcher polls again after it feeds the body, so the body is read with no
        // waker: a wake would poll the connection's task once more for nothing. The timer
        // is what brings back a call whose body never comes (one pipelined behind another
        // is polled only when a read happens, and none may).
        Feeding::PolledAfterReads => {
            timer.set(Some(tokio::time::sleep(deadline)));
            std::future::poll_fn(|cx| match std::mem::replace(&mut waited, true) {
                true => Poll::Ready(()),
                false => {
                    if let Some(timer) = timer.as_mut().as_pin_mut() {
                        let _ = timer.poll(cx);
                    }
                    Poll::Pending
                }
            })
            .await;
            if reading.drain(&mut body)? {
                return Ok(reading.into_body());
            }
        }
        Feeding::Woken => {
            let first = std::future::poll_fn(|cx| match body.poll_next_unpin(cx) {
                Poll::Ready(item) => Poll::Ready(Some(item)),
                Poll::Pending if !std::mem::replace(&mut waited, true) => {
                    // Polled again at once: nothing else would bring back a call whose
                    // body stops arriving here, with no timer yet.
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Poll::Pending => Poll::Ready(None),
            })
            .await;
            match first {
                Some(None) => return Ok(reading.into_body()),
                Some(Some(chunk)) => {
                    reading.take(chunk)?;
                    if reading.drain(&mut body)? {
                        return Ok(reading.into_body());
                    }
                }
                None => {}
            }
            timer.set(Some(tokio::time::sleep(deadline)));
        }
    }
    // Still arriving.
    let mut share = CallerHeld {
        slot: &limits.by_caller[limits.slot_index(caller)],
        bytes: 0,
        max: limits.per_caller,
    };
    share.grow_to(reading.held.bytes)?;
    reading.caller = Some(share);
    if caller.anonymous {
        let mut pool = AnonymousHeld { limits, bytes: 0 };
        pool.grow_to(reading.held.bytes)?;
        reading.anonymous = Some(pool);
    }
    std::future::poll_fn(|cx| {
        loop {
            match body.poll_next_unpin(cx) {
                Poll::Ready(Some(chunk)) => reading.take(chunk)?,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        match timer.as_mut().as_pin_mut().map(|timer| timer.poll(cx)) {
            Some(Poll::Pending) => Poll::Pending,
            _ => Poll::Ready(Err(GatewayError::RequestTimeout(deadline.as_secs()))),
        }
    })
    .await?;
    Ok(reading.into_body())
}
