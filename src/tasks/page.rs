//! ListTasks paging, shared by every list the gateway answers itself: the task store and
//! the record kept of tasks relayed to 0.3 upstreams. Newest status first, then newest
//! created, then by id; a page token is the position of the last item a page held.
//!
//! The id settles ties: replicas sharing a store each count creation from their own start,
//! so two tasks can share a status time and a creation number, and a position without the
//! id would skip one of them at a page boundary.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};

use super::StoreError;
use crate::protocol::model::TaskState;
use crate::protocol::params::ListQuery;

/// Where an item sorts: its status time (µs), its creation order and its id (a UUID's
/// value, else a stable hash of the id).
pub(crate) type SortKey = (i64, u64, u128);

pub(crate) fn sort_key(timestamp: Option<DateTime<Utc>>, seq: u64, id: &str) -> SortKey {
    (
        timestamp.map_or(0, |t| t.timestamp_micros()),
        seq,
        id_order(id),
    )
}

/// An id's place among ids: a UUID's value; any other id, a stable (FNV-1a) hash of it.
fn id_order(id: &str) -> u128 {
    let tail = id.rsplit('.').next().unwrap_or(id);
    match uuid::Uuid::try_parse(tail) {
        Ok(u) => u.as_u128(),
        Err(_) => id
            .bytes()
            .fold(0x6c62272e07bb014262b821756295c58d, |h: u128, b| {
                (h ^ u128::from(b)).wrapping_mul(0x0000000001000000000000000000013B)
            }),
    }
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
    URL_SAFE_NO_PAD.encode(format!("{}:{}:{:x}", key.0, key.1, key.2))
}

fn decode_token(token: &str) -> Result<SortKey, StoreError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| StoreError::BadPageToken)?;
    let text = String::from_utf8(bytes).map_err(|_| StoreError::BadPageToken)?;
    let mut fields = text.splitn(3, ':');
    let mut next = || fields.next().ok_or(StoreError::BadPageToken);
    let (ts, seq) = (next()?, next()?);
    // A token issued before ids settled ties: after everything at its position.
    let id = match next() {
        Ok(hex) => u128::from_str_radix(hex, 16).map_err(|_| StoreError::BadPageToken)?,
        Err(_) => u128::MAX,
    };
    Ok((
        ts.parse().map_err(|_| StoreError::BadPageToken)?,
        seq.parse().map_err(|_| StoreError::BadPageToken)?,
        id,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two replicas' tasks can share a status time and a creation number: paging one at a
    /// time still visits every one, once.
    #[test]
    fn ties_in_time_and_creation_are_settled_by_id() {
        let at = Some(Utc::now());
        let ids = [
            "00000000-0000-4000-8000-000000000002",
            "00000000-0000-4000-8000-000000000001",
            "up.not-a-uuid",
            "00000000-0000-4000-8000-000000000003",
        ];
        let matching = || {
            ids.iter()
                .map(|id| (sort_key(at, 7, id), id.to_string()))
                .collect::<Vec<_>>()
        };
        let mut query = ListQuery::first_page(1, false);
        let mut seen = Vec::new();
        loop {
            let (items, next, total) = page(matching(), &query).unwrap();
            assert_eq!(total, ids.len());
            seen.extend(items);
            if next.is_empty() {
                break;
            }
            query.page_token = Some(next);
        }
        seen.sort();
        let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(seen, want);
    }
}
