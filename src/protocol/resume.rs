//! SSE event ids of task streams, and the `Last-Event-ID` a client resumes with.
//!
//! An event's id names its task and the version the task had once the event was applied
//! (`<task id>:<version>`; the first snapshot of a new task is version 0), so that a
//! client coming back with the last id it read gets the events after it and no other.

use crate::error::GatewayError;

/// The id of the event that made `task` version `version`.
pub fn event_id(task: &str, version: u64) -> String {
    format!("{task}:{version}")
}

/// Where a client resumes: the task, and the version of the last event it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeFrom {
    pub task_id: String,
    pub version: u64,
}

/// Reads a `Last-Event-ID` this gateway sent; anything else is a precise error.
pub fn read_last_event_id(value: &str) -> Result<ResumeFrom, GatewayError> {
    let bad = || {
        GatewayError::InvalidParams(format!(
            "Last-Event-ID \"{}\" is not an event id of this gateway (<task id>:<version>)",
            value.chars().take(80).collect::<String>()
        ))
    };
    let (task, version) = value.trim().rsplit_once(':').ok_or_else(bad)?;
    let version = version.parse::<u64>().map_err(|_| bad())?;
    if task.is_empty() {
        return Err(bad());
    }
    Ok(ResumeFrom {
        task_id: task.to_string(),
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back() {
        let id = event_id("0f1e2d3c-0000-4000-8000-000000000000", 7);
        let from = read_last_event_id(&id).unwrap();
        assert_eq!(from.task_id, "0f1e2d3c-0000-4000-8000-000000000000");
        assert_eq!(from.version, 7);
        for bad in ["", "nonsense", "abc:", ":3", "abc:-1", "abc:x"] {
            assert!(read_last_event_id(bad).is_err(), "{bad}");
        }
    }
}
