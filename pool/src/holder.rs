//! Who a container runs for, as Mesos names it: the executor and framework whose container it
//! is and, where one task runs in it (the command executor's and the Docker containerizer's
//! tasks), that task. Recorded with a reservation's owner so that every reader of the pool
//! (`gpu list`, `serve`, metrics) can say whose GPUs they are.
//!
//! The ids come from the `ContainerConfig` Mesos hands the isolator at `prepare`
//! (`executor_info.{executor_id, framework_id}`, `task_info.{task_id, name}`,
//! `include/mesos/slave/containerizer.proto`) or, for a Docker task, from the `TaskInfo` and
//! `ExecutorInfo` of the agent's Docker hook. The framework's name is not in either: it is read
//! from the agent (`GET /state`, `frameworks[].name`) when it is shown.

use serde::{Deserialize, Serialize};

/// The Mesos identity of a container's holder; a field Mesos did not give is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Holder {
    /// The executor (`ExecutorInfo.executor_id`; the task id for the command executor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_id: Option<String>,
    /// The framework (`ExecutorInfo.framework_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_id: Option<String>,
    /// The framework's name, read from the agent (never recorded by the module at `prepare`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_name: Option<String>,
    /// The one task of the container (`TaskInfo.task_id`), when Mesos says which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// That task's name (`TaskInfo.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_name: Option<String>,
}

impl Holder {
    /// `None` when nothing is known, so that an empty holder is never recorded.
    pub fn known(self) -> Option<Holder> {
        (self != Holder::default()).then_some(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unknown_fields_are_left_out_and_read_back_as_none() {
        let holder = Holder {
            executor_id: Some("e".into()),
            task_id: Some("t".into()),
            ..Holder::default()
        };
        let text = serde_json::to_string(&holder).unwrap();
        assert_eq!(text, r#"{"executor_id":"e","task_id":"t"}"#);
        assert_eq!(serde_json::from_str::<Holder>(&text).unwrap(), holder);
        assert_eq!(Holder::default().known(), None);
        assert_eq!(holder.clone().known(), Some(holder));
    }
}
