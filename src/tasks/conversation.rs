//! What a backend that answers a whole conversation reads and notes: the earlier tasks of a
//! context, and entries in a task's metadata (token counts, say).

use super::{Applied, Tasks, Viewer};
use crate::error::GatewayError;
use crate::protocol::model::{Metadata, Task};
use crate::protocol::params::ListQuery;

impl Tasks {
    /// Up to `limit` of the viewer's tasks in `context_id` other than `except`, the most
    /// recent ones, oldest first. Across replicas when they share a store. Listing visits
    /// every task held here, like ListTasks: a cost next to a model's answer, not a
    /// request's.
    pub(crate) async fn context_tasks(
        &self,
        viewer: Viewer<'_>,
        context_id: &str,
        except: &str,
        limit: usize,
    ) -> Result<Vec<Task>, GatewayError> {
        let query = ListQuery {
            context_id: Some(context_id.to_string()),
            state: None,
            page_size: limit.saturating_add(1),
            page_token: None,
            history_length: None,
            status_after: None,
            include_artifacts: false,
        };
        // Newest first. This replica's own tasks as held here: the shared store may not
        // have the last one's answer yet (it is written behind).
        let mut tasks = self.list(viewer, &query)?.tasks;
        if let Some(shared) = self.list_shared(viewer, &query).await {
            for task in shared?.tasks {
                if !tasks.iter().any(|t| t.id == task.id) {
                    tasks.push(task);
                }
            }
            tasks.sort_by_key(|t| std::cmp::Reverse(t.status.timestamp));
        }
        tasks.retain(|t| t.id != except);
        tasks.truncate(limit);
        tasks.reverse();
        Ok(tasks)
    }

    /// Adds `entries` to an unfinished task's metadata, replacing those of the same keys.
    /// Stored (and written behind) with the task; subscribers learn of them through the
    /// event that carries them.
    pub(crate) fn annotate(&self, id: &str, entries: &Metadata) -> Applied {
        let mut applied = Applied::TaskFinished;
        let found = self.store.update(id, &mut |st| {
            if st.task.status.state.is_terminal() {
                return;
            }
            let metadata = st.task.metadata.get_or_insert_with(Metadata::new);
            metadata.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
            applied = Applied::Yes;
        });
        if found {
            applied
        } else {
            Applied::NotFound
        }
    }
}
