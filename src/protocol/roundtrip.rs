//! Property: any valid 1.0 task, message or stream event, written in 0.3 and read back,
//! is the same value in everything both dialects define (proptest generates them).

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Value};

use super::model::StreamEnd;
use super::model::{
    Artifact, Message, Part, PartContent, Role, StreamItem, Task, TaskArtifactUpdateEvent,
    TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use super::v03::{StreamItemV03, V03};

fn id() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9.-]{0,20}"
}

fn text() -> impl Strategy<Value = String> {
    // Any text, escapes and non-ASCII included.
    "\\PC{0,30}"
}

fn metadata() -> impl Strategy<Value = Option<Map<String, Value>>> {
    option::of(
        btree_map("[a-z]{1,6}", text(), 1..3)
            .prop_map(|m| m.into_iter().map(|(k, v)| (k, Value::String(v))).collect()),
    )
}

/// Parts as both dialects carry them: text with metadata; files with a name and a media
/// type, as bytes (base64) or a URI; data as an object.
fn part() -> impl Strategy<Value = Part> {
    let text_part = (text(), metadata()).prop_map(|(t, metadata)| Part {
        content: PartContent::Text(t),
        metadata,
        filename: None,
        media_type: None,
    });
    let file = (
        prop_oneof![
            vec(any::<u8>(), 0..12).prop_map(|bytes| {
                use base64::Engine;
                PartContent::Raw(base64::engine::general_purpose::STANDARD.encode(bytes))
            }),
            "https://[a-z]{1,8}\\.example/[a-z]{0,8}".prop_map(PartContent::Url),
        ],
        "[a-z]{1,8}\\.txt",
        "(text|application)/[a-z]{1,8}",
    )
        .prop_map(|(content, name, media)| Part {
            content,
            metadata: None,
            filename: Some(name),
            media_type: Some(media),
        });
    let data = btree_map("[a-z]{1,6}", any::<i32>(), 0..3).prop_map(|m| Part {
        content: PartContent::Data(Value::Object(
            m.into_iter().map(|(k, v)| (k, Value::from(v))).collect(),
        )),
        metadata: None,
        filename: None,
        media_type: None,
    });
    prop_oneof![text_part, file, data]
}

fn message() -> impl Strategy<Value = Message> {
    (
        id(),
        option::of(id()),
        option::of(id()),
        prop_oneof![Just(Role::User), Just(Role::Agent)],
        vec(part(), 1..4),
        metadata(),
        vec(id(), 0..2),
    )
        .prop_map(
            |(message_id, context_id, task_id, role, parts, metadata, refs)| Message {
                message_id,
                context_id,
                task_id,
                role,
                parts,
                metadata,
                extensions: Vec::new(),
                reference_task_ids: refs,
            },
        )
}

fn state() -> impl Strategy<Value = TaskState> {
    prop_oneof![
        Just(TaskState::Submitted),
        Just(TaskState::Working),
        Just(TaskState::InputRequired),
        Just(TaskState::AuthRequired),
        Just(TaskState::Completed),
        Just(TaskState::Canceled),
        Just(TaskState::Failed),
        Just(TaskState::Rejected),
    ]
}

fn status() -> impl Strategy<Value = TaskStatus> {
    (state(), option::of(message()), 0i64..4_000_000_000).prop_map(|(state, message, secs)| {
        TaskStatus {
            state,
            message: message.map(Box::new),
            // Millisecond precision: what both dialects write.
            timestamp: chrono::DateTime::from_timestamp_millis(secs * 1000 + 123),
        }
    })
}

fn artifact() -> impl Strategy<Value = Artifact> {
    (
        id(),
        option::of(text()),
        option::of(text()),
        vec(part(), 1..3),
        metadata(),
    )
        .prop_map(
            |(artifact_id, name, description, parts, metadata)| Artifact {
                artifact_id,
                name,
                description,
                parts,
                metadata,
                extensions: Vec::new(),
            },
        )
}

fn task() -> impl Strategy<Value = Task> {
    (
        id(),
        id(),
        status(),
        vec(artifact(), 0..3),
        vec(message(), 0..3),
        metadata(),
    )
        .prop_map(
            |(id, context_id, status, artifacts, history, metadata)| Task {
                id,
                context_id,
                status,
                artifacts,
                history,
                metadata,
            },
        )
}

fn event() -> impl Strategy<Value = StreamItem> {
    prop_oneof![
        (id(), id(), status(), metadata()).prop_map(|(task_id, context_id, status, metadata)| {
            StreamItem::StatusUpdate(TaskStatusUpdateEvent {
                task_id,
                context_id,
                status,
                metadata,
            })
        }),
        (id(), id(), artifact(), any::<bool>(), any::<bool>()).prop_map(
            |(task_id, context_id, artifact, append, last_chunk)| {
                StreamItem::ArtifactUpdate(TaskArtifactUpdateEvent {
                    task_id,
                    context_id,
                    artifact,
                    append,
                    last_chunk,
                    metadata: None,
                })
            }
        ),
        task().prop_map(StreamItem::Task),
        message().prop_map(StreamItem::Message),
    ]
}

/// Reads a 0.3 stream event back (the kind tag says which).
fn read_v03_event(v: Value) -> StreamItem {
    match v["kind"].as_str() {
        Some("task") => StreamItem::Task(serde_json::from_value(v).unwrap()),
        Some("message") => StreamItem::Message(serde_json::from_value(v).unwrap()),
        Some("status-update") => StreamItem::StatusUpdate(serde_json::from_value(v).unwrap()),
        Some("artifact-update") => StreamItem::ArtifactUpdate(serde_json::from_value(v).unwrap()),
        other => panic!("unexpected kind {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_task_survives_0_3(task in task()) {
        let v03 = serde_json::to_string(&V03(&task)).unwrap();
        let back: Task = serde_json::from_str(&v03).unwrap();
        prop_assert_eq!(back, task);
    }

    #[test]
    fn a_message_survives_0_3(message in message()) {
        let v03 = serde_json::to_string(&V03(&message)).unwrap();
        let back: Message = serde_json::from_str(&v03).unwrap();
        prop_assert_eq!(back, message);
    }

    #[test]
    fn a_stream_event_survives_0_3(item in event()) {
        let v03 = serde_json::to_value(StreamItemV03(&item, StreamEnd::Interrupted)).unwrap();
        prop_assert_eq!(read_v03_event(v03), item);
    }

    #[test]
    fn a_task_survives_1_0(task in task()) {
        let v10 = serde_json::to_string(&task).unwrap();
        let back: Task = serde_json::from_str(&v10).unwrap();
        prop_assert_eq!(back, task);
    }
}
