//! A2A wire formats: the canonical model, the 0.3 output shapes, JSON-RPC envelopes and
//! request params. Nothing here knows about HTTP or actix, so it is unit-testable alone.

mod common_send;
pub mod grpc;
pub(crate) mod grpc_send;
pub(crate) mod grpc_v03;
pub mod jsonrpc;
pub mod model;
pub mod ops;
pub mod params;
mod protojson;
pub mod push;
pub mod relay;
pub mod resume;
mod scan;
pub mod v01;
pub mod v03;
pub mod write;

#[cfg(test)]
mod roundtrip;

use crate::error::GatewayError;

/// The header naming the extensions a call asks for, and an answer those activated, in
/// `dialect`'s spelling (1.0 `A2A-Extensions`, 0.3 `X-A2A-Extensions`).
pub(crate) fn extensions_header(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::V10 => "a2a-extensions",
        Dialect::V03 | Dialect::V01 => "x-a2a-extensions",
    }
}

/// The extensions header's value in a header map of any kind (`get` reads one header),
/// by either spelling, 1.0's first.
pub(crate) fn extensions_in<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> Option<&'a str> {
    let value =
        get(extensions_header(Dialect::V10)).or_else(|| get(extensions_header(Dialect::V03)));
    value.and_then(|v| std::str::from_utf8(v).ok())
}

/// The 0.3 members a hybrid card carries beside 1.0's; a 1.0 card (its proto's JSON) has
/// none of them.
pub(crate) const V03_CARD_MEMBERS: [&str; 6] = [
    "url",
    "protocolVersion",
    "preferredTransport",
    "additionalInterfaces",
    "supportsAuthenticatedExtendedCard",
    "security",
];

/// The protocol generation a caller speaks; every answer goes out in the caller's dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Dialect {
    /// The `tasks/send` generation, spoken by callers only (never by upstreams), named
    /// by its method names alone. Errors and everything not task-shaped answer as 0.3.
    V01,
    V03,
    V10,
}

impl Dialect {
    /// Reads an `A2A-Version` value. Only `Major.Minor` counts; absent or empty means the
    /// caller did not say (the reference: that means 0.3, unless the method name says 1.0).
    pub fn from_version_header(value: Option<&str>) -> Result<Option<Dialect>, GatewayError> {
        // What nearly every caller sends, without the general reading below.
        match value {
            Some("1.0") => return Ok(Some(Dialect::V10)),
            Some("0.3") => return Ok(Some(Dialect::V03)),
            _ => {}
        }
        let Some(raw) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let mut parts = raw.split('.');
        let major = parts.next().unwrap_or_default();
        let minor = parts.next().unwrap_or("0");
        match (major, minor) {
            ("0", "3") => Ok(Some(Dialect::V03)),
            ("1", "0") => Ok(Some(Dialect::V10)),
            _ => Err(GatewayError::VersionNotSupported {
                requested: raw.to_string(),
                supported: "0.3, 1.0",
            }),
        }
    }

    pub fn version(self) -> &'static str {
        match self {
            Dialect::V01 => "0.1",
            Dialect::V03 => "0.3",
            Dialect::V10 => "1.0",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_header_is_major_minor_only() {
        for (raw, want) in [
            (None, None),
            (Some(""), None),
            (Some("1.0"), Some(Dialect::V10)),
            (Some("1.0.1"), Some(Dialect::V10)),
            (Some("1"), Some(Dialect::V10)),
            (Some("0.3.0"), Some(Dialect::V03)),
        ] {
            assert_eq!(Dialect::from_version_header(raw).unwrap(), want, "{raw:?}");
        }
        for bad in ["2.0", "0.2", "abc", "1.1"] {
            assert!(Dialect::from_version_header(Some(bad)).is_err(), "{bad}");
        }
    }
}
