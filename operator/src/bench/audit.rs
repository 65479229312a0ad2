//! The API server's audit log of the operator's user (scripts/control-plane.sh writes one line
//! per request of `kart-operator`): the requests an operator made, counted by verb and resource.

use anyhow::Context;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The verbs that write.
const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One request of the log.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub verb: String,
    stage: String,
    #[serde(default)]
    object_ref: ObjectRef,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

impl Request {
    /// Its resource, with the subresource (`trainingjobs/status`).
    pub fn resource(&self) -> String {
        match &self.object_ref.subresource {
            Some(sub) => format!("{}/{sub}", self.object_ref.resource),
            None => self.object_ref.resource.clone(),
        }
    }

    /// Whether it writes.
    pub fn writes(&self) -> bool {
        WRITES.contains(&self.verb.as_str())
    }

    /// Whether it writes a child (not a status, an Event or the leader's Lease).
    pub fn writes_child(&self) -> bool {
        self.writes()
            && self.object_ref.subresource.is_none()
            && !matches!(self.object_ref.resource.as_str(), "events" | "leases")
    }
}

/// The audit log, read from where the last read stopped.
pub struct AuditLog {
    path: PathBuf,
    offset: u64,
}

impl AuditLog {
    /// The log at `path`, from its current end: what was requested before is not counted.
    pub fn from_end(path: &Path) -> anyhow::Result<Self> {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(AuditLog { path: path.to_path_buf(), offset })
    }

    /// The requests logged since the last call: each once (a watch when it starts, any other
    /// request when it completes).
    pub fn read(&mut self) -> anyhow::Result<Vec<Request>> {
        let mut file =
            std::fs::File::open(&self.path).with_context(|| format!("reading {}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut reader = BufReader::new(file);
        let mut requests = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            let read = reader.read_line(&mut line)?;
            // A line still being written is read next time.
            if read == 0 || !line.ends_with('\n') {
                break;
            }
            self.offset += read as u64;
            let request: Request = serde_json::from_str(&line)
                .with_context(|| format!("an audit event of {}: {line}", self.path.display()))?;
            let counted = match request.verb.as_str() {
                "watch" => request.stage == "ResponseStarted",
                _ => request.stage == "ResponseComplete",
            };
            if counted {
                requests.push(request);
            }
        }
        Ok(requests)
    }
}

/// Requests counted by verb.
pub fn by_verb(requests: &[Request]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests {
        *counts.entry(r.verb.clone()).or_default() += 1;
    }
    counts
}

/// Writes counted by `verb resource`.
pub fn writes(requests: &[Request], which: fn(&Request) -> bool) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests.iter().filter(|r| which(r)) {
        *counts.entry(format!("{} {}", r.verb, r.resource())).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn requests_are_counted_once_and_a_partial_line_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let event = |verb: &str, stage: &str, resource: &str, sub: Option<&str>| {
            serde_json::json!({"kind": "Event", "verb": verb, "stage": stage,
                               "objectRef": {"resource": resource, "subresource": sub}})
            .to_string()
        };
        std::fs::write(&path, format!("{}\n", event("list", "ResponseComplete", "pods", None))).unwrap();
        let mut log = AuditLog::from_end(&path).unwrap();
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        for line in [
            event("watch", "ResponseStarted", "jobs", None),
            event("watch", "ResponseComplete", "jobs", None),
            event("patch", "ResponseComplete", "deployments", None),
            event("patch", "ResponseComplete", "trainingjobs", Some("status")),
            event("update", "ResponseComplete", "leases", None),
        ] {
            writeln!(file, "{line}").unwrap();
        }
        write!(file, "{{\"verb\": \"get\"").unwrap();
        let requests = log.read().unwrap();
        assert_eq!(
            by_verb(&requests),
            BTreeMap::from([("patch".into(), 2), ("update".into(), 1), ("watch".into(), 1)])
        );
        assert_eq!(
            writes(&requests, Request::writes_child),
            BTreeMap::from([("patch deployments".into(), 1)])
        );
        assert_eq!(writes(&requests, Request::writes).len(), 3);
        writeln!(file, ", \"stage\": \"ResponseComplete\", \"objectRef\": {{\"resource\": \"pods\"}}}}")
            .unwrap();
        assert_eq!(by_verb(&log.read().unwrap()), BTreeMap::from([("get".into(), 1)]));
    }
}
