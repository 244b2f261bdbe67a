//! ListTasks paging, shared by every list the gateway answers itself: the task store and
//! the record kept of tasks relayed to 0.3 upstreams. Newest status first, then newest
//! created; a page token is the position of the last item a page held.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};

use super::StoreError;
use crate::protocol::model::TaskState;
use crate::protocol::params::ListQuery;

/// Where an item sorts: its status time (µs) and its creation order.
pub(crate) type SortKey = (i64, u64);

pub(crate) fn sort_key(timestamp: Option<DateTime<Utc>>, seq: u64) -> SortKey {
    (timestamp.map_or(0, |t| t.timestamp_micros()), seq)
}

/// Whether a task with these facts passes the query's filters.
pub(crate) fn admits(
    query: &ListQuery,
    context_id: &str,
    state: TaskState,
    timestamp: Option<DateTime<Utc>>,
) -> bool {
    query.context_id.as_ref().is_none_or(|c| c == context_id)
        && query.state.is_none_or(|s| s == state)
        && query
            .status_after
            .is_none_or(|after| timestamp.is_some_and(|ts| ts >= after))
}

/// One page of `matching` (in any order): the items, the next page's token ("" on the
/// last page) and how many matched in all.
pub(crate) fn page<T>(
    mut matching: Vec<(SortKey, T)>,
    query: &ListQuery,
) -> Result<(Vec<T>, String, usize), StoreError> {
    let after = query.page_token.as_deref().map(decode_token).transpose()?;
    let total = matching.len();
    matching.sort_unstable_by_key(|(key, _)| std::cmp::Reverse(*key));
    let start = match after {
        Some(cursor) => matching.partition_point(|(key, _)| *key >= cursor),
        None => 0,
    };
    let items: Vec<(SortKey, T)> = matching
        .into_iter()
        .skip(start)
        .take(query.page_size)
        .collect();
    let next = match items.last() {
        Some((key, _)) if start + items.len() < total => encode_token(*key),
        _ => String::new(),
    };
    Ok((items.into_iter().map(|(_, t)| t).collect(), next, total))
}

fn encode_token(key: SortKey) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", key.0, key.1))
}

fn decode_token(token: &str) -> Result<SortKey, StoreError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| StoreError::BadPageToken)?;
    let text = String::from_utf8(bytes).map_err(|_| StoreError::BadPageToken)?;
    let (ts, seq) = text.split_once(':').ok_or(StoreError::BadPageToken)?;
    Ok((
        ts.parse().map_err(|_| StoreError::BadPageToken)?,
        seq.parse().map_err(|_| StoreError::BadPageToken)?,
    ))
}
