//! One row of a results table: key columns, which identify it when a run resumes, and value columns.

#[derive(Debug, Clone)]
pub struct Row {
    pub keys: Vec<(&'static str, String)>,
    pub values: Vec<(&'static str, String)>,
}

impl Row {
    /// The row's identity: its key columns as `k=v,k=v`.
    pub fn id(&self) -> String {
        self.keys
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}
