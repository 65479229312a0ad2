//! A stateful fake Kubernetes API server: enough of the API for kube's `Client`, `Api` and
//! `Controller` to run against it, in process (as a tower `Service` behind
//! [`FakeApiServer::client`]) or over HTTP ([`FakeApiServer::serve`]).
//!
//! Supported: any resource under `/api/v1` and `/apis/{group}/{version}`, namespaced (and
//! cluster-wide lists and watches); get, list (equality label selectors, `metadata.name` field
//! selectors), watch (newline-delimited events replayed from any `resourceVersion`, then live),
//! create, replace (optimistic concurrency on `resourceVersion`: 409), merge and strategic-merge
//! patches, server-side apply with create-on-apply, delete; `resourceVersion` (one counter),
//! `generation` (bumped when anything outside metadata and status changes), `uid`,
//! `creationTimestamp`; the `status` subresource (writes to the main resource keep the status,
//! writes to `/status` change only the status); the `scale` subresource (`spec.replicas`,
//! `status.replicas`, `status.selector`); finalizers and `deletionTimestamp`; owner-reference
//! cascade on delete (dependents go at once, as background propagation would, and so does an
//! object written with owners none of which exists, as the garbage collector would); injected
//! failures ([`FakeApiServer::fail`]).
//!
//! Simplifications: server-side apply merges the applied fields into the stored object (objects
//! merged key by key, lists and scalars replaced) without field ownership, so a field dropped
//! from an applied configuration stays; no schema validation, defaulting or admission; no
//! pagination; watches never expire (no 410 Gone).

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// One stored change, for watches.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    resource: String,
    kind: &'static str,
    object: Value,
}

/// A failure to inject.
#[derive(Debug, Clone)]
struct Fault {
    method: Method,
    path_contains: String,
    code: u16,
    remaining: usize,
}

#[derive(Default)]
struct Store {
    rv: u64,
    uid: u64,
    /// (resource, namespace, name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    log: Vec<Change>,
    faults: Vec<Fault>,
    requests: Vec<String>,
}

/// The fake API server; clones share state.
#[derive(Clone)]
pub struct FakeApiServer {
    store: Arc<Mutex<Store>>,
    changes: broadcast::Sender<Change>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        FakeApiServer { store: Arc::default(), changes: broadcast::channel(4096).0 }
    }
}

/// Where a request points.
#[derive(Debug, Clone)]
struct Target {
    /// `{group}/{version}/{plural}` (`/v1/pods` for the core group).
    resource: String,
    api_version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return None,
    };
    let api_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(Target {
        resource: format!("{group}/{version}/{plural}"),
        api_version,
        plural: plural.to_string(),
        namespace,
        name,
        subresource,
    })
}

/// The kind of a plural resource name (for lists of an empty collection).
fn kind_of(plural: &str) -> String {
    let known = [
        ("pods", "Pod"),
        ("services", "Service"),
        ("configmaps", "ConfigMap"),
        ("secrets", "Secret"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"),
        ("deployments", "Deployment"),
        ("replicasets", "ReplicaSet"),
        ("jobs", "Job"),
        ("leases", "Lease"),
        ("events", "Event"),
        ("retrievers", "Retriever"),
        ("rolloutpools", "RolloutPool"),
        ("trainingjobs", "TrainingJob"),
    ];
    known
        .iter()
        .find(|(p, _)| *p == plural)
        .map_or_else(|| plural.trim_end_matches('s').to_string(), |(_, k)| k.to_string())
}

/// A refused request: HTTP code, reason, message.
struct Rejection(u16, &'static str, String);

fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code,
    });
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body))
        .into_response()
}

fn not_found(t: &Target) -> Response {
    status(404, "NotFound", format!("{} \"{}\" not found", t.plural, t.name.clone().unwrap_or_default()))
}

/// RFC 7386 merge of `patch` into `target` (`null` deletes).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Everything but metadata and status (what `generation` tracks).
fn desired(obj: &Value) -> Value {
    let mut o = obj.as_object().cloned().unwrap_or_default();
    o.remove("metadata");
    o.remove("status");
    Value::Object(o)
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            get(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            get(k.trim()) == Some(v.trim_start_matches('=').trim())
        } else if let Some(k) = term.strip_prefix('!') {
            get(k.trim()).is_none()
        } else {
            get(term.trim()).is_some()
        }
    })
}

fn fields_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| match term.split_once('=') {
        Some((path, v)) => {
            let pointer = format!("/{}", path.replace('.', "/"));
            obj.pointer(&pointer).and_then(Value::as_str) == Some(v.trim_start_matches('='))
        }
        None => true,
    })
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl FakeApiServer {
    /// An empty server.
    pub fn new() -> Self {
        FakeApiServer::default()
    }

    /// The HTTP router (every path goes to one handler).
    pub fn router(&self) -> Router {
        Router::new().fallback(handle).with_state(self.clone())
    }

    /// A `kube::Client` talking to this server in process, default namespace `namespace`.
    pub fn client(&self, namespace: &str) -> kube::Client {
        kube::Client::new(self.router(), namespace)
    }

    /// Serves over HTTP on `listener` until the task is dropped.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }

    /// The next `times` requests whose method is `method` and whose path contains
    /// `path_contains` fail with HTTP `code` (409 as a conflict, 5xx as a server error).
    pub fn fail(&self, method: Method, path_contains: &str, code: u16, times: usize) {
        let mut s = self.store.lock().expect("store lock");
        s.faults.push(Fault { method, path_contains: path_contains.into(), code, remaining: times });
    }

    /// Every request so far, as `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        self.store.lock().expect("store lock").requests.clone()
    }

    /// Object `name` of `resource` (`apps/v1/deployments`, `/v1/configmaps`) in `namespace`.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let s = self.store.lock().expect("store lock");
        s.objects.get(&(resource.into(), namespace.into(), name.into())).cloned()
    }

    /// The names of the objects of `resource` in `namespace`, sorted.
    pub fn names(&self, resource: &str, namespace: &str) -> Vec<String> {
        let s = self.store.lock().expect("store lock");
        s.objects.keys().filter(|(r, ns, _)| r == resource && ns == namespace).map(|k| k.2.clone()).collect()
    }

    /// Stores `obj` as a change of `kind` and tells watchers.
    fn record(&self, s: &mut Store, resource: &str, kind: &'static str, obj: Value) {
        let change = Change { rv: s.rv, resource: resource.into(), kind, object: obj };
        s.log.push(change.clone());
        let _ = self.changes.send(change);
    }

    fn next_rv(s: &mut Store) -> u64 {
        s.rv += 1;
        s.rv
    }

    /// Writes `obj` as the new version of `key` (create or update) and returns it.
    fn write(&self, s: &mut Store, key: (String, String, String), mut obj: Value, created: bool) -> Value {
        let rv = Self::next_rv(s);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let terminating_done = obj.pointer("/metadata/deletionTimestamp").is_some()
            && obj.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
        if terminating_done {
            self.remove(s, &key);
            return obj;
        }
        s.objects.insert(key.clone(), obj.clone());
        self.record(s, &key.0, if created { "ADDED" } else { "MODIFIED" }, obj.clone());
        if orphaned(s, &obj) {
            self.delete(s, &key);
        }
        obj
    }

    /// Deletes `key` (or marks it terminating while it has finalizers); cascades to dependents.
    fn delete(&self, s: &mut Store, key: &(String, String, String)) -> Option<Value> {
        let mut obj = s.objects.get(key)?.clone();
        let has_finalizers =
            obj.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if obj.pointer("/metadata/deletionTimestamp").is_none() {
                obj["metadata"]["deletionTimestamp"] = json!(now());
                return Some(self.write(s, key.clone(), obj, false));
            }
            return Some(obj);
        }
        self.remove(s, key);
        Some(obj)
    }

    fn remove(&self, s: &mut Store, key: &(String, String, String)) {
        let Some(mut obj) = s.objects.remove(key) else { return };
        let rv = Self::next_rv(s);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let uid = obj.pointer("/metadata/uid").cloned();
        self.record(s, &key.0, "DELETED", obj);
        let dependents: Vec<_> = s
            .objects
            .iter()
            .filter(|(_, o)| {
                o.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r.get("uid") == uid.as_ref()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for dependent in dependents {
            self.delete(s, &dependent);
        }
    }
}

async fn handle(
    State(server): State<FakeApiServer>,
    method: Method,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    {
        let mut s = server.store.lock().expect("store lock");
        s.requests.push(format!("{method} {path}"));
        if let Some(fault) = s
            .faults
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == method && path.contains(&f.path_contains))
        {
            fault.remaining -= 1;
            let code = fault.code;
            let reason = if code == 409 { "Conflict" } else { "InternalError" };
            return status(code, reason, format!("injected failure of {method} {path}"));
        }
    }
    let Some(target) = parse(&path) else { return status(404, "NotFound", format!("no route {path}")) };
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return status(400, "BadRequest", format!("body: {e}")),
        }
    };
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (method, target.name.is_some()) {
        (Method::GET, false) if watch => server.watch(&target, &query),
        (Method::GET, false) => server.list(&target, &query),
        (Method::GET, true) => server.read(&target),
        (Method::POST, false) => server.create(&target, body),
        (Method::PUT, true) => server.replace(&target, body),
        (Method::PATCH, true) => server.patch(&target, body, &content_type),
        (Method::DELETE, true) => {
            let mut s = server.store.lock().expect("store lock");
            let key = (
                target.resource.clone(),
                target.namespace.clone().unwrap_or_default(),
                target.name.clone().unwrap_or_default(),
            );
            match server.delete(&mut s, &key) {
                Some(obj) => axum::Json(obj).into_response(),
                None => not_found(&target),
            }
        }
        (m, _) => status(405, "MethodNotAllowed", format!("{m} {path}")),
    }
}

impl FakeApiServer {
    fn key(t: &Target) -> (String, String, String) {
        (t.resource.clone(), t.namespace.clone().unwrap_or_default(), t.name.clone().unwrap_or_default())
    }

    fn matches(t: &Target, query: &HashMap<String, String>, resource: &str, obj: &Value) -> bool {
        resource == t.resource
            && t.namespace
                .as_deref()
                .is_none_or(|ns| obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns))
            && query.get("labelSelector").is_none_or(|l| labels_match(obj, l))
            && query.get("fieldSelector").is_none_or(|f| fields_match(obj, f))
    }

    fn list(&self, t: &Target, query: &HashMap<String, String>) -> Response {
        let s = self.store.lock().expect("store lock");
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|(k, o)| Self::matches(t, query, &k.0, o))
            .map(|(_, o)| o.clone())
            .collect();
        axum::Json(json!({
            "apiVersion": t.api_version,
            "kind": format!("{}List", kind_of(&t.plural)),
            "metadata": {"resourceVersion": s.rv.to_string()},
            "items": items,
        }))
        .into_response()
    }

    fn watch(&self, t: &Target, query: &HashMap<String, String>) -> Response {
        let since: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let (replay, live) = {
            let s = self.store.lock().expect("store lock");
            let replay: Vec<Change> = if since == 0 {
                s.objects
                    .iter()
                    .filter(|(k, o)| Self::matches(t, query, &k.0, o))
                    .map(|(k, o)| Change {
                        rv: s.rv,
                        resource: k.0.clone(),
                        kind: "ADDED",
                        object: o.clone(),
                    })
                    .collect()
            } else {
                s.log
                    .iter()
                    .filter(|c| c.rv > since && Self::matches(t, query, &c.resource, &c.object))
                    .cloned()
                    .collect()
            };
            (replay, self.changes.subscribe())
        };
        let timeout = query.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(290u64);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
        let first = futures::stream::iter(replay.iter().map(event_line).collect::<Vec<_>>());
        let rest = futures::stream::unfold(
            (live, t.clone(), query.clone()),
            move |(mut live, t, query)| async move {
                loop {
                    match tokio::time::timeout_at(deadline, live.recv()).await {
                        Ok(Ok(c)) if Self::matches(&t, &query, &c.resource, &c.object) => {
                            return Some((event_line(&c), (live, t, query)));
                        }
                        Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => {}
                        _ => return None,
                    }
                }
            },
        );
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(first.chain(rest)))
            .expect("a streaming response")
    }

    fn read(&self, t: &Target) -> Response {
        let s = self.store.lock().expect("store lock");
        let Some(obj) = s.objects.get(&Self::key(t)) else { return not_found(t) };
        match t.subresource.as_deref() {
            Some("scale") => axum::Json(scale(obj)).into_response(),
            _ => axum::Json(obj.clone()).into_response(),
        }
    }

    /// A new object: uid, generation 1, creation time, the path's namespace.
    fn create_object(&self, s: &mut Store, t: &Target, mut obj: Value) -> Result<Value, Rejection> {
        let meta = obj
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| Rejection(400, "BadRequest", "no metadata".into()))?;
        if !meta.contains_key("name")
            && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
        {
            let name = format!("{prefix}{:05}", s.uid + 1);
            meta.insert("name".into(), json!(name));
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| Rejection(422, "Invalid", "metadata.name is required".into()))?
            .to_string();
        if let Some(ns) = &t.namespace {
            meta.insert("namespace".into(), json!(ns));
        }
        let key = (t.resource.clone(), t.namespace.clone().unwrap_or_default(), name.clone());
        if s.objects.contains_key(&key) {
            return Err(Rejection(409, "AlreadyExists", format!("{} \"{name}\" already exists", t.plural)));
        }
        s.uid += 1;
        meta.insert("uid".into(), json!(format!("uid-{}", s.uid)));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.remove("resourceVersion");
        Ok(self.write(s, key, obj, true))
    }

    fn create(&self, t: &Target, body: Value) -> Response {
        let mut s = self.store.lock().expect("store lock");
        match self.create_object(&mut s, t, body) {
            Ok(obj) => (StatusCode::CREATED, axum::Json(obj)).into_response(),
            Err(Rejection(code, reason, message)) => status(code, reason, message),
        }
    }

    /// Stores `new` over `old`: the status from `old` unless writing `/status` (then only the
    /// status from `new`), generation bumped when the desired state changed.
    fn update(&self, s: &mut Store, t: &Target, old: &Value, new: Value) -> Value {
        let mut obj = match t.subresource.as_deref() {
            Some("status") => {
                let mut o = old.clone();
                match new.get("status") {
                    Some(st) => o["status"] = st.clone(),
                    None => drop(o.as_object_mut().map(|m| m.remove("status"))),
                }
                o
            }
            _ => {
                let mut o = new;
                match old.get("status") {
                    Some(st) => o["status"] = st.clone(),
                    None => drop(o.as_object_mut().map(|m| m.remove("status"))),
                }
                for k in ["uid", "creationTimestamp", "generation", "deletionTimestamp"] {
                    match old.pointer(&format!("/metadata/{k}")) {
                        Some(v) => o["metadata"][k] = v.clone(),
                        None => drop(o["metadata"].as_object_mut().map(|m| m.remove(k))),
                    }
                }
                o
            }
        };
        if desired(&obj) != desired(old) {
            let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            obj["metadata"]["generation"] = json!(generation);
        }
        self.write(s, Self::key(t), obj, false)
    }

    fn replace(&self, t: &Target, body: Value) -> Response {
        let mut s = self.store.lock().expect("store lock");
        let Some(old) = s.objects.get(&Self::key(t)).cloned() else { return not_found(t) };
        let sent = body.pointer("/metadata/resourceVersion").and_then(Value::as_str);
        let stored = old.pointer("/metadata/resourceVersion").and_then(Value::as_str);
        if sent.is_some_and(|v| Some(v) != stored) {
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            );
        }
        let new = if t.subresource.as_deref() == Some("scale") { with_replicas(&old, &body) } else { body };
        let obj = self.update(&mut s, t, &old, new);
        if t.subresource.as_deref() == Some("scale") {
            return axum::Json(scale(&obj)).into_response();
        }
        axum::Json(obj).into_response()
    }

    fn patch(&self, t: &Target, body: Value, content_type: &str) -> Response {
        let mut s = self.store.lock().expect("store lock");
        let apply = content_type.starts_with("application/apply-patch");
        if !apply && !content_type.contains("merge-patch") {
            return status(415, "UnsupportedMediaType", format!("patch type {content_type}"));
        }
        let Some(old) = s.objects.get(&Self::key(t)).cloned() else {
            if apply && t.subresource.is_none() {
                return match self.create_object(&mut s, t, body) {
                    Ok(obj) => (StatusCode::CREATED, axum::Json(obj)).into_response(),
                    Err(Rejection(code, reason, message)) => status(code, reason, message),
                };
            }
            return not_found(t);
        };
        let new = if t.subresource.as_deref() == Some("scale") {
            let replicas = body.pointer("/spec/replicas").cloned().unwrap_or(Value::Null);
            with_replicas(&old, &json!({"spec": {"replicas": replicas}}))
        } else {
            let mut merged = old.clone();
            merge(&mut merged, &body);
            merged
        };
        let obj = self.update(&mut s, t, &old, new);
        if t.subresource.as_deref() == Some("scale") {
            return axum::Json(scale(&obj)).into_response();
        }
        axum::Json(obj).into_response()
    }
}

/// Whether `obj` has owners and none of them exists (the garbage collector deletes it).
fn orphaned(s: &Store, obj: &Value) -> bool {
    let Some(owners) =
        obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).filter(|o| !o.is_empty())
    else {
        return false;
    };
    !owners.iter().any(|o| s.objects.values().any(|x| x.pointer("/metadata/uid") == o.get("uid")))
}

/// `obj` with `spec.replicas` from a Scale body.
fn with_replicas(obj: &Value, scale: &Value) -> Value {
    let mut o = obj.clone();
    o["spec"]["replicas"] = scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0));
    o
}

/// The `autoscaling/v1` Scale of `obj`.
fn scale(obj: &Value) -> Value {
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": obj.pointer("/metadata/name"),
            "namespace": obj.pointer("/metadata/namespace"),
            "resourceVersion": obj.pointer("/metadata/resourceVersion"),
        },
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": obj.pointer("/status/selector").cloned().unwrap_or(json!("")),
        },
    })
}

/// One watch event line.
fn event_line(c: &Change) -> Result<Bytes, std::convert::Infallible> {
    let mut text = serde_json::to_vec(&json!({"type": c.kind, "object": c.object})).expect("json");
    text.push(b'\n');
    Ok(Bytes::from(text))
}
