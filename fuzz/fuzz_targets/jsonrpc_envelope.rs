//! Differential: the one-pass envelope reader (an agent's own endpoint) and the careful
//! two-pass one must agree on every body: the same id, method, dialect and params, or the
//! same error.
#![no_main]

use a2a_gateway::protocol::jsonrpc::{parse_request, parse_request_for_agent, Method};
use a2a_gateway::protocol::params::{self, SendParams};
use a2a_gateway::protocol::Dialect;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    for header in [None, Some(Dialect::V03), Some(Dialect::V10)] {
        let one = parse_request_for_agent(body, header);
        let two = parse_request(body, header);
        match (one, two) {
            (Ok(one), Ok(two)) => {
                assert_eq!(
                    (&one.id, one.method, one.dialect),
                    (&two.id, two.method, two.dialect)
                );
                let sends = matches!(
                    one.method,
                    Method::SendMessage | Method::SendStreamingMessage
                ) && one.dialect != Dialect::V01;
                if sends {
                    let decoded = |r: &a2a_gateway::protocol::jsonrpc::RpcRequest<'_>| match &r.send
                    {
                        Some(p) => Ok(format!("{p:?}")),
                        None => params::decode::<SendParams>(r.params)
                            .map(|p| format!("{p:?}"))
                            .map_err(|e| e.to_string()),
                    };
                    assert_eq!(decoded(&one), decoded(&two));
                } else {
                    assert_eq!(one.params.map(|p| p.get()), two.params.map(|p| p.get()));
                }
            }
            (Err(one), Err(two)) => {
                assert_eq!(
                    (one.id, one.dialect, one.error.to_string()),
                    (two.id, two.dialect, two.error.to_string())
                );
            }
            (one, two) => panic!("readers disagree: {one:?} vs {two:?}"),
        }
    }
});
