//! Rendered cards, signed, kept with their compressed forms. The aggregated card unites every
//! visible agent's skills (151 KB with 2,000 agents): it is rendered once per key (the
//! caller's access scope, the base URL its links use, the shape of its security fields, the
//! generation of upstream cards) and compressed at most once per encoding, then served from
//! memory. A new key, or an upstream card that changes, renders it anew; the cache is
//! bounded (a caller choosing many Host headers only makes it render more often).

use std::io::Write;
use std::sync::{Arc, OnceLock};

use actix_web::http::header;
use actix_web::HttpRequest;
use bytes::Bytes;

use crate::auth::AccessKey;

/// Which card: the gateway's (aggregated) or an agent's, public or extended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Which {
    Gateway,
    Agent(Arc<str>),
}

/// What a card depends on besides the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CardKey {
    pub(crate) which: Which,
    pub(crate) extended: bool,
    /// The caller's access scope (the aggregated card lists the agents it may call; an
    /// agent's card is the same for everyone: [`AccessKey::All`]).
    pub(crate) access: AccessKey,
    pub(crate) base: String,
    pub(crate) v10: bool,
    /// The registry in force ([`crate::agents::Registry::id`]) and its upstream cards'
    /// generation: a new agent set or a changed upstream card is a new key.
    pub(crate) registry: u64,
    pub(crate) generation: u64,
}

pub(crate) struct CardCache {
    cards: quick_cache::sync::Cache<CardKey, Arc<Rendered>>,
}

/// How many rendered cards are kept: each is signed once when rendered.
const CAPACITY: usize = 1024;

impl CardCache {
    pub(crate) fn new() -> CardCache {
        CardCache {
            cards: quick_cache::sync::Cache::new(CAPACITY),
        }
    }

    /// The card for `key`, rendered by `render` when it is not kept.
    pub(crate) fn get_or_render<E>(
        &self,
        key: &CardKey,
        render: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Arc<Rendered>, E> {
        self.cards
            .get_or_insert_with(key, || render().map(|body| Arc::new(Rendered::new(body))))
    }
}

/// A content coding a client accepts, best first: br, then gzip, else none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coding {
    Identity,
    Gzip,
    Brotli,
}

impl Coding {
    pub(crate) fn preferred(req: &HttpRequest) -> Coding {
        let mut best = Coding::Identity;
        for value in req.headers().get_all(header::ACCEPT_ENCODING) {
            let Ok(value) = value.to_str() else { continue };
            for item in value.split(',') {
                let mut parts = item.split(';');
                let name = parts.next().unwrap_or_default().trim();
                let refused = parts.any(|p| {
                    p.trim()
                        .strip_prefix("q=")
                        .and_then(|q| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                if refused {
                    continue;
                }
                if name.eq_ignore_ascii_case("br") {
                    best = Coding::Brotli;
                } else if name.eq_ignore_ascii_case("gzip") && best == Coding::Identity {
                    best = Coding::Gzip;
                }
            }
        }
        best
    }

    pub(crate) fn header_value(self) -> Option<&'static str> {
        match self {
            Coding::Identity => None,
            Coding::Gzip => Some("gzip"),
            Coding::Brotli => Some("br"),
        }
    }
}

/// A card's JSON, its validator, and its compressed forms (each with its own validator)
/// once asked for.
pub(crate) struct Rendered {
    plain: Encoded,
    /// When it was rendered, to the second (`Last-Modified`).
    modified: std::time::SystemTime,
    gzip: OnceLock<Option<Encoded>>,
    brotli: OnceLock<Option<Encoded>>,
}

type Compressor = fn(&[u8]) -> Option<Bytes>;

/// A body as sent, with its strong ETag.
#[derive(Clone)]
pub(crate) struct Encoded {
    pub(crate) body: Bytes,
    pub(crate) etag: String,
}

impl Rendered {
    pub(crate) fn new(body: Vec<u8>) -> Rendered {
        Rendered {
            plain: Encoded {
                etag: crate::card::etag(&body),
                body: Bytes::from(body),
            },
            modified: whole_seconds(std::time::SystemTime::now()),
            gzip: OnceLock::new(),
            brotli: OnceLock::new(),
        }
    }

    /// The card's JSON.
    pub(crate) fn json(&self) -> &Bytes {
        &self.plain.body
    }

    /// When it was rendered: an upstream card that changes, or a reload, renders it anew.
    pub(crate) fn modified(&self) -> std::time::SystemTime {
        self.modified
    }

    /// The body in `coding` (compressed once, then kept), or the plain body when
    /// compressing fails; and the coding it is in. Each coding is its own representation,
    /// so its ETag is the plain one's with the coding's name.
    pub(crate) fn encoded(&self, coding: Coding) -> (&Encoded, Coding) {
        let (cell, compress): (_, Compressor) = match coding {
            Coding::Identity => return (&self.plain, Coding::Identity),
            Coding::Gzip => (&self.gzip, gzip),
            Coding::Brotli => (&self.brotli, brotli),
        };
        let encoded = cell.get_or_init(|| {
            let name = coding.header_value()?;
            Some(Encoded {
                body: compress(&self.plain.body)?,
                etag: format!("{}-{name}\"", self.plain.etag.trim_end_matches('"')),
            })
        });
        match encoded {
            Some(e) => (e, coding),
            None => (&self.plain, Coding::Identity),
        }
    }
}

/// `time` without its fraction of a second, as HTTP dates have it, so that a date read
/// back from `If-Modified-Since` compares equal.
fn whole_seconds(time: std::time::SystemTime) -> std::time::SystemTime {
    let secs = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn gzip(body: &[u8]) -> Option<Bytes> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(body).ok()?;
    encoder.finish().ok().map(Bytes::from)
}

fn brotli(body: &[u8]) -> Option<Bytes> {
    let mut out = Vec::new();
    {
        // Quality 5 compresses about as well as gzip's best at a fraction of brotli 11's time.
        let mut writer = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        writer.write_all(body).ok()?;
    }
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use std::io::Read;

    fn coding(accept: &str) -> Coding {
        let req = TestRequest::default()
            .insert_header((header::ACCEPT_ENCODING, accept))
            .to_http_request();
        Coding::preferred(&req)
    }

    #[test]
    fn negotiates_br_then_gzip_and_honours_q_zero() {
        assert_eq!(coding("gzip, deflate, br"), Coding::Brotli);
        assert_eq!(coding("gzip"), Coding::Gzip);
        assert_eq!(coding("GZIP;q=0.5"), Coding::Gzip);
        assert_eq!(coding("br;q=0, gzip"), Coding::Gzip);
        assert_eq!(coding("gzip;q=0"), Coding::Identity);
        assert_eq!(coding("identity"), Coding::Identity);
        assert_eq!(
            Coding::preferred(&TestRequest::default().to_http_request()),
            Coding::Identity
        );
    }

    #[test]
    fn compressed_forms_decode_to_the_body_and_have_their_own_etags() {
        let body = br#"{"skills":["a","a","a","a","a","a","a","a","a","a"]}"#.repeat(50);
        let card = Rendered::new(body.clone());
        let (plain, _) = card.encoded(Coding::Identity);
        assert_eq!(plain.body, body);
        let (gz, c) = card.encoded(Coding::Gzip);
        assert_eq!(c, Coding::Gzip);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz.body[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);
        let (br, _) = card.encoded(Coding::Brotli);
        let mut out = Vec::new();
        brotli::Decompressor::new(&br.body[..], 4096)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);
        assert!(gz.body.len() < body.len() / 4 && br.body.len() < body.len() / 4);
        assert!(
            gz.etag.starts_with('"') && gz.etag.ends_with("-gzip\""),
            "{}",
            gz.etag
        );
        assert_ne!(plain.etag, gz.etag);
        assert_ne!(gz.etag, br.etag);
        // Compressed once, then kept.
        assert!(std::ptr::eq(card.encoded(Coding::Gzip).0, gz));
    }

    #[test]
    fn renders_once_per_key() {
        let cache = CardCache::new();
        let key = CardKey {
            which: Which::Gateway,
            extended: false,
            access: AccessKey::Anonymous,
            base: "http://x".into(),
            v10: false,
            registry: 0,
            generation: 0,
        };
        let mut renders = 0;
        for _ in 0..3 {
            cache
                .get_or_render(&key, || {
                    renders += 1;
                    Ok::<_, ()>(b"{}".to_vec())
                })
                .unwrap();
        }
        assert_eq!(renders, 1);
        let newer = CardKey {
            generation: 1,
            ..key
        };
        cache
            .get_or_render(&newer, || {
                renders += 1;
                Ok::<_, ()>(b"{}".to_vec())
            })
            .unwrap();
        assert_eq!(renders, 2);
    }
}
