//! JSON bodies for the rejections actix-http writes itself. Its HTTP/1 dispatcher answers a
//! request it cannot parse (400: a bad request line, URI or header), a head past its 128 KiB
//! buffer or 96 headers (431) and a head that did not arrive within the header timeout (408)
//! with an empty body, and offers no hook to change that. Every other answer of the gateway
//! has a JSON body, so each connection's stream is wrapped: when a write starts with one of
//! those three heads (an empty body and no content type, which no handler of ours writes),
//! the same status goes out with a JSON body instead. Everything else passes through.
//!
//! After such an answer the dispatcher closes the connection without reading what the
//! client is still sending (the rest of a head too large, say), and a socket closed with
//! unread data is reset, which can destroy the answer before the client reads it. So the
//! wrapper closes its sending side and reads the rest away first, until the client closes
//! or the dispatcher's disconnect timeout ends it (lingering, as nginx does).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_http::Protocol;
use actix_service::{fn_service, ServiceFactory, ServiceFactoryExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The listener's service: tells HTTP/1 from h2c by the preface (as actix's
/// `tcp_auto_h2c` does) and hands the HTTP service each connection wrapped.
pub(crate) fn tcp_with_json_rejections<F>(
    http: F,
) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = F::Error, InitError = ()>
where
    F: ServiceFactory<
        (JsonRejections<TcpStream>, Protocol, Option<SocketAddr>),
        Config = (),
        Response = (),
        InitError = (),
    >,
    F::Error: From<io::Error>,
{
    fn_service(|io: TcpStream| async move {
        no_delay(&io);
        const H2_PREFACE: &[u8] = b"PRI * HTTP/2";
        let mut buf = [0u8; 12];
        io.peek(&mut buf).await?;
        let protocol = if buf == H2_PREFACE {
            Protocol::Http2
        } else {
            Protocol::Http1
        };
        let peer = io.peer_addr().ok();
        Ok::<_, F::Error>((JsonRejections::new(io), protocol, peer))
    })
    .and_then(http)
}

/// Sends each write at once. With Nagle's algorithm on, a streamed answer's next chunk (an
/// SSE event, a stream's closing chunk) waits until the client acknowledges the previous
/// one, and clients delay that acknowledgement by up to 40 ms: every streamed call (an A2A
/// stream, an MCP tool call) took 40 ms more. A unary answer goes out in one write either way.
pub(crate) fn no_delay(io: &TcpStream) {
    if let Err(e) = io.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
}

/// A connection whose dispatcher-written rejections get JSON bodies.
pub(crate) struct JsonRejections<IO> {
    io: IO,
    /// The replacement being written, and how much of it has gone.
    pending: Option<(Vec<u8>, usize)>,
    linger: Linger,
}

/// How a connection whose request was rejected ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Linger {
    /// No rejection written: closed as usual.
    No,
    /// Close the sending side, then read until the client closes.
    Shutdown,
    Drain,
}

impl<IO> JsonRejections<IO> {
    pub(crate) fn new(io: IO) -> Self {
        JsonRejections {
            io,
            pending: None,
            linger: Linger::No,
        }
    }
    /// The connection underneath (its TLS session, say).
    pub(crate) fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncWrite + Unpin> JsonRejections<IO> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            match ready!(Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n => *written += n,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for JsonRejections<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for JsonRejections<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some((head_len, replacement)) = replacement_for(buf) {
            // The dispatcher's head counts as written; the replacement goes out before
            // anything else is written, flushed or shut down.
            this.pending = Some((replacement, 0));
            this.linger = Linger::Shutdown;
            let _ = this.poll_pending(cx)?;
            return Poll::Ready(Ok(head_len));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if this.linger == Linger::No {
            return Pin::new(&mut this.io).poll_shutdown(cx);
        }
        if this.linger == Linger::Shutdown {
            ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.linger = Linger::Drain;
        }
        let mut scratch = [0u8; 8192];
        loop {
            let mut read = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if !read.filled().is_empty() => continue,
                // The client closed (or the connection broke): done.
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// When `buf` starts with a head actix-http writes for a rejection of its own: that head's
/// length and the answer to write in its place.
fn replacement_for(buf: &[u8]) -> Option<(usize, Vec<u8>)> {
    if !(buf.starts_with(b"HTTP/1.1 4") || buf.starts_with(b"HTTP/1.0 4")) || buf.len() < 13 {
        return None;
    }
    let (status, message) = match &buf[9..12] {
        b"400" => (
            400,
            "malformed HTTP request: the request line, the URI (at most 64 KiB) or a header could not be parsed",
        ),
        b"408" => (
            408,
            "the request head did not arrive within the header timeout",
        ),
        b"431" => (
            431,
            "request head too large: the request line and headers must fit in 128 KiB, with at most 96 headers",
        ),
        _ => return None,
    };
    let head_len = find(buf, b"\r\n\r\n")? + 4;
    let head = &buf[..head_len];
    if find(head, b"\r\ncontent-length: 0\r\n").is_none() || find(head, b"content-type:").is_some()
    {
        return None;
    }
    let body = crate::error::status_body(status, message, None).to_string();
    let status_line = &buf[..find(buf, b"\r\n")?];
    let mut answer = Vec::with_capacity(status_line.len() + body.len() + 96);
    answer.extend_from_slice(status_line);
    answer.extend_from_slice(
        format!(
            "\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    answer.extend_from_slice(body.as_bytes());
    Some((head_len, answer))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTIX_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: Mon, 23 Nov 2026 23:44:29 GMT\r\n\r\n";

    #[test]
    fn the_dispatchers_rejections_get_json_bodies() {
        let (len, answer) = replacement_for(ACTIX_400).unwrap();
        assert_eq!(len, ACTIX_400.len());
        let answer = String::from_utf8(answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], 400);
        let head_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        assert!(replacement_for(head_431).is_some());
    }

    #[tokio::test]
    async fn accepted_connections_send_each_write_at_once() {
        use actix_service::Service;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(!accepted.nodelay().unwrap(), "sockets start with Nagle on");
        let http = fn_service(
            |(io, _, _): (JsonRejections<TcpStream>, Protocol, Option<SocketAddr>)| async move {
                assert!(
                    io.get_ref().nodelay()?,
                    "TCP_NODELAY set before the HTTP service"
                );
                Ok::<_, io::Error>(())
            },
        );
        let listen = tcp_with_json_rejections(http)
            .new_service(())
            .await
            .unwrap();
        listen.call(accepted).await.unwrap();
    }

    #[test]
    fn answers_of_the_gateway_pass_through() {
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ncontent-type: application/json\r\n\r\n";
        assert!(replacement_for(ours).is_none(), "has a content type");
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(replacement_for(ok).is_none());
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}";
        assert!(replacement_for(with_body).is_none());
        assert!(replacement_for(b"HTTP/1.1 4").is_none());
        assert!(
            replacement_for(b"\x00\x00\x12\x04").is_none(),
            "an h2 frame"
        );
    }
}
