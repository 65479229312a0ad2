//! A run's `rollouts.jsonl` (one decoded trajectory a line, as the trainer's `dump_rollouts`
//! writes it) indexed as it grows: each line's place in the file and what the viewer filters and
//! summarises by, so a trajectory is read from the file only when it is shown. A file that
//! shrank (a resumed run rewrites the steps after its checkpoint) is indexed again from the start.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What the list of trajectories shows of one, and filters by.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Its line in the file, from 0: the handle the page asks for it by.
    pub line: usize,
    pub step: u64,
    pub id: String,
    pub prompt_id: String,
    pub reward: f64,
    pub status: String,
    /// The environment's data source (`nq`, `hotpotqa`, a tool set's name).
    pub env: String,
    /// The workflow role that produced it, where a workflow has roles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Calls by tool.
    pub tools: BTreeMap<String, u64>,
    pub turns: u64,
    pub response_tokens: u64,
    /// Policy versions its oldest token lagged behind the policy it trained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness: Option<i64>,
    #[serde(skip)]
    offset: u64,
    #[serde(skip)]
    len: usize,
}

/// Which trajectories to list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub step: Option<u64>,
    pub min_reward: Option<f64>,
    pub max_reward: Option<f64>,
    pub env: Option<String>,
    pub role: Option<String>,
    /// Trajectories that called this tool at least once.
    pub tool: Option<String>,
    pub prompt_id: Option<String>,
}

impl Filter {
    fn keeps(&self, e: &Entry) -> bool {
        self.step.is_none_or(|s| e.step == s)
            && self.min_reward.is_none_or(|r| e.reward >= r)
            && self.max_reward.is_none_or(|r| e.reward <= r)
            && self.env.as_ref().is_none_or(|env| &e.env == env)
            && self.role.as_ref().is_none_or(|role| e.role.as_ref() == Some(role))
            && self.tool.as_ref().is_none_or(|tool| e.tools.get(tool).is_some_and(|&n| n > 0))
            && self.prompt_id.as_ref().is_none_or(|p| &e.prompt_id == p)
    }
}

/// One step's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepSummary {
    pub step: u64,
    pub trajectories: u64,
    pub reward_mean: f64,
    pub reward_min: f64,
    pub reward_max: f64,
    /// Calls per trajectory, by tool.
    pub tool_calls: BTreeMap<String, f64>,
    pub statuses: BTreeMap<String, u64>,
    pub groups: u64,
}

/// The whole file's figures and the values each filter can take.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub file: String,
    pub trajectories: usize,
    /// Lines that are not a trajectory as the trainer writes them.
    pub unreadable: usize,
    pub steps: Vec<StepSummary>,
    pub envs: Vec<String>,
    pub roles: Vec<String>,
    pub tools: Vec<String>,
}

/// A page of the list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    /// Trajectories the filter keeps.
    pub total: usize,
    pub items: Vec<Entry>,
}

#[derive(Debug, Default)]
struct Scanned {
    /// Bytes indexed: everything before the first incomplete line.
    offset: u64,
    /// The last line indexed, to tell a file rewritten since from one appended to.
    last_line: Vec<u8>,
    entries: Vec<Entry>,
    unreadable: usize,
}

/// The indexed file.
#[derive(Debug)]
pub struct Rollouts {
    path: PathBuf,
    scanned: Mutex<Scanned>,
}

/// Why a trajectory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("no trajectory at line {0}")]
    NoSuchLine(usize),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}, line {line}: {source}")]
    Json { path: PathBuf, line: usize, source: serde_json::Error },
}

impl Rollouts {
    /// The index of `path` (read on first use; a missing file is an empty run).
    pub fn new(path: &Path) -> Rollouts {
        Rollouts { path: path.to_path_buf(), scanned: Mutex::new(Scanned::default()) }
    }

    /// The file indexed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Indexes what was appended since the last call.
    fn refresh(&self) -> Result<std::sync::MutexGuard<'_, Scanned>, ReadError> {
        let io = |source| ReadError::Io { path: self.path.clone(), source };
        let mut s = self.scanned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *s = Scanned::default();
                return Ok(s);
            }
            Err(e) => return Err(io(e)),
        };
        let len = file.metadata().map_err(io)?.len();
        if len < s.offset || !ends_with(&mut file, s.offset, &s.last_line).map_err(io)? {
            *s = Scanned::default();
        }
        file.seek(SeekFrom::Start(s.offset)).map_err(io)?;
        let mut reader = BufReader::new(file.take(len - s.offset));
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).map_err(io)?;
            if n == 0 || line.last() != Some(&b'\n') {
                break;
            }
            let number = s.entries.len() + s.unreadable;
            match serde_json::from_slice::<Value>(&line).ok().and_then(|v| entry(&v, number)) {
                Some(mut e) => {
                    (e.offset, e.len) = (s.offset, n);
                    s.entries.push(e);
                }
                None => s.unreadable += 1,
            }
            s.offset += n as u64;
            std::mem::swap(&mut s.last_line, &mut line);
        }
        Ok(s)
    }

    /// The whole file's figures.
    pub fn summary(&self) -> Result<Summary, ReadError> {
        let s = self.refresh()?;
        let mut steps: BTreeMap<u64, Vec<&Entry>> = BTreeMap::new();
        for e in &s.entries {
            steps.entry(e.step).or_default().push(e);
        }
        let distinct = |f: &dyn Fn(&Entry) -> Vec<String>| {
            let mut v: Vec<String> = s.entries.iter().flat_map(f).collect();
            v.sort();
            v.dedup();
            v
        };
        Ok(Summary {
            file: self.path.display().to_string(),
            trajectories: s.entries.len(),
            unreadable: s.unreadable,
            steps: steps.into_iter().map(|(step, entries)| step_summary(step, &entries)).collect(),
            envs: distinct(&|e| vec![e.env.clone()]),
            roles: distinct(&|e| e.role.iter().cloned().collect()),
            tools: distinct(&|e| e.tools.keys().cloned().collect()),
        })
    }

    /// The trajectories `filter` keeps, `limit` of them from the `offset`-th.
    pub fn list(&self, filter: &Filter, offset: usize, limit: usize) -> Result<Page, ReadError> {
        let s = self.refresh()?;
        let kept: Vec<&Entry> = s.entries.iter().filter(|e| filter.keeps(e)).collect();
        Ok(Page { total: kept.len(), items: kept.into_iter().skip(offset).take(limit).cloned().collect() })
    }

    /// The trajectory of line `line`, whole, as the trainer wrote it (its decoded segments, its
    /// statistics and its tokens).
    pub fn get(&self, line: usize) -> Result<Value, ReadError> {
        let (offset, len) = {
            let s = self.refresh()?;
            let e = s.entries.iter().find(|e| e.line == line).ok_or(ReadError::NoSuchLine(line))?;
            (e.offset, e.len)
        };
        let io = |source| ReadError::Io { path: self.path.clone(), source };
        let mut file = std::fs::File::open(&self.path).map_err(io)?;
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut bytes = vec![0; len];
        file.read_exact(&mut bytes).map_err(io)?;
        serde_json::from_slice(&bytes).map_err(|source| ReadError::Json {
            path: self.path.clone(),
            line,
            source,
        })
    }
}

/// Whether the `offset` bytes of `file` end with `last`.
fn ends_with(file: &mut std::fs::File, offset: u64, last: &[u8]) -> std::io::Result<bool> {
    if last.is_empty() {
        return Ok(true);
    }
    file.seek(SeekFrom::Start(offset - last.len() as u64))?;
    let mut bytes = vec![0; last.len()];
    file.read_exact(&mut bytes)?;
    Ok(bytes == last)
}

fn step_summary(step: u64, entries: &[&Entry]) -> StepSummary {
    let n = entries.len() as f64;
    let rewards = entries.iter().map(|e| e.reward);
    let mut tool_calls: BTreeMap<String, f64> = BTreeMap::new();
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for e in entries {
        for (tool, calls) in &e.tools {
            *tool_calls.entry(tool.clone()).or_default() += *calls as f64 / n;
        }
        *statuses.entry(e.status.clone()).or_default() += 1;
    }
    let mut prompts: Vec<&str> = entries.iter().map(|e| e.prompt_id.as_str()).collect();
    prompts.sort_unstable();
    prompts.dedup();
    StepSummary {
        step,
        trajectories: entries.len() as u64,
        reward_mean: rewards.clone().sum::<f64>() / n,
        reward_min: rewards.clone().fold(f64::INFINITY, f64::min),
        reward_max: rewards.fold(f64::NEG_INFINITY, f64::max),
        tool_calls,
        statuses,
        groups: prompts.len() as u64,
    }
}

/// The list's fields of a line, `None` unless it is a trajectory as the trainer dumps it.
fn entry(v: &Value, line: usize) -> Option<Entry> {
    let stats = &v["stats"];
    let tools = stats["tool_calls"]
        .as_object()
        .map(|calls| {
            calls
                .iter()
                .map(|(tool, c)| {
                    (tool.clone(), c["ok"].as_u64().unwrap_or(0) + c["failed"].as_u64().unwrap_or(0))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Entry {
        line,
        step: v["step"].as_u64()?,
        id: v["id"].as_str()?.to_string(),
        prompt_id: v["prompt_id"].as_str()?.to_string(),
        reward: v["reward"].as_f64()?,
        status: v["status"].as_str().unwrap_or("unknown").to_string(),
        env: v["data_source"].as_str().unwrap_or("").to_string(),
        role: stats["role"].as_str().map(str::to_string),
        tools,
        turns: stats["turns"].as_u64().unwrap_or(0),
        response_tokens: stats["response_tokens"].as_u64().unwrap_or(0),
        staleness: v["staleness"].as_i64(),
        offset: 0,
        len: 0,
    })
    .filter(|_| v["segments"].is_array())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    fn line(step: u64, id: &str, prompt: &str, reward: f64, tools: Value, role: Option<&str>) -> String {
        let mut stats = json!({"turns": 2, "tool_calls": tools, "response_tokens": 5});
        if let Some(role) = role {
            stats["role"] = json!(role);
        }
        let v = json!({"step": step, "id": id, "prompt_id": prompt, "reward": reward, "status": "completed",
                       "stats": stats, "staleness": 1, "data_source": "nq",
                       "segments": [{"role": "prompt", "text": "Q"}, {"role": "model", "text": "A"}]});
        format!("{v}\n")
    }

    #[test]
    fn lines_are_indexed_as_they_come_and_read_whole_on_demand() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rollouts.jsonl");
        let r = Rollouts::new(&path);
        assert_eq!(r.summary().unwrap().trajectories, 0, "no file yet: an empty run");
        let search = json!({"search": {"ok": 2, "failed": 1}});
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(line(1, "a", "p0", 1.0, search.clone(), None).as_bytes()).unwrap();
        f.write_all(line(1, "b", "p0", 0.0, json!({}), Some("solver")).as_bytes()).unwrap();
        f.write_all(b"not json\n").unwrap();
        // Half a line: not yet.
        let second = line(2, "c", "p1", 0.5, search, Some("solver"));
        f.write_all(&second.as_bytes()[..10]).unwrap();
        let s = r.summary().unwrap();
        assert_eq!((s.trajectories, s.unreadable, s.steps.len()), (2, 1, 1));
        assert_eq!(s.steps[0].reward_mean, 0.5);
        assert_eq!(s.steps[0].tool_calls["search"], 1.5, "3 calls over 2 trajectories");
        assert_eq!(
            (s.roles.clone(), s.tools.clone()),
            (vec!["solver".to_string()], vec!["search".to_string()])
        );
        f.write_all(&second.as_bytes()[10..]).unwrap();
        let page = r.list(&Filter::default(), 0, 10).unwrap();
        assert_eq!(page.items.iter().map(|e| e.line).collect::<Vec<_>>(), [0, 1, 3]);
        let by =
            |f: Filter| r.list(&f, 0, 10).unwrap().items.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        assert_eq!(by(Filter { step: Some(2), ..Filter::default() }), ["c"]);
        assert_eq!(by(Filter { min_reward: Some(0.5), ..Filter::default() }), ["a", "c"]);
        assert_eq!(by(Filter { max_reward: Some(0.0), ..Filter::default() }), ["b"]);
        assert_eq!(by(Filter { tool: Some("search".into()), ..Filter::default() }), ["a", "c"]);
        assert_eq!(by(Filter { role: Some("solver".into()), ..Filter::default() }), ["b", "c"]);
        assert_eq!(by(Filter { prompt_id: Some("p0".into()), ..Filter::default() }), ["a", "b"]);
        assert_eq!(by(Filter { env: Some("hotpotqa".into()), ..Filter::default() }), Vec::<String>::new());
        assert_eq!(
            r.list(&Filter::default(), 1, 1).unwrap(),
            Page { total: 3, items: vec![page.items[1].clone()] }
        );
        assert_eq!(r.get(3).unwrap()["id"], "c");
        assert!(matches!(r.get(2), Err(ReadError::NoSuchLine(2))), "the unreadable line");
        // A resumed run rewrote the file, shorter or not: indexed afresh.
        std::fs::write(&path, line(1, "z", "p9", 0.0, json!({}), None)).unwrap();
        let page = r.list(&Filter::default(), 0, 10).unwrap();
        assert_eq!((page.total, page.items[0].id.as_str()), (1, "z"));
        let longer: String = (0..5).map(|i| line(1, &format!("y{i}"), "p9", 0.0, json!({}), None)).collect();
        std::fs::write(&path, longer).unwrap();
        let page = r.list(&Filter::default(), 0, 10).unwrap();
        assert_eq!((page.total, page.items[0].id.as_str()), (5, "y0"));
    }
}
