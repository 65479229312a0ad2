//! Where a rollout worker may load a policy's weights from: the trainer's URL and the shared
//! volume, so that a request (even an authenticated one) cannot make it fetch from elsewhere or
//! read any file the worker can.

use crate::wire::{InvalidField, WeightSource};
use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};

/// The admitted weight sources of `POST /weights` and a `/rollout`'s `weights`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WeightSources {
    /// URL prefixes weights may be downloaded from, each with a path (the trainer's
    /// `http://host:port/weights/`); one `*` in the host stands for one or more letters, digits
    /// or hyphens within a DNS label (`http://*-trainer.ml.svc:8002/weights/`: the trainers of
    /// namespace `ml`); empty: any URL.
    pub url_prefixes: Vec<String>,
    /// The folder weights files may be read from (the shared volume); unset: any path.
    pub path_prefix: Option<PathBuf>,
}

impl WeightSources {
    /// Checks the prefixes, naming the field and the value.
    pub fn validate(&self) -> Result<(), super::ConfigError> {
        for (i, prefix) in self.url_prefixes.iter().enumerate() {
            let rest = prefix.strip_prefix("http://").or_else(|| prefix.strip_prefix("https://"));
            let has_path = rest.and_then(|rest| rest.find('/')).is_some_and(|slash| slash > 0);
            let field = || format!("weight_sources.url_prefixes[{i}]");
            if !has_path {
                return Err(super::ConfigError::new(
                    field(),
                    prefix,
                    "must be an http(s) URL with a path, e.g. http://trainer:8002/weights/",
                ));
            }
            let host = rest.and_then(|rest| rest.split('/').next()).unwrap_or_default();
            let stars = prefix.matches('*').count();
            if stars > 1 || (stars == 1 && !host.contains('*')) {
                return Err(super::ConfigError::new(field(), prefix, "may hold one `*`, in the host"));
            }
        }
        match &self.path_prefix {
            Some(path) if !path.is_absolute() => Err(super::ConfigError::new(
                "weight_sources.path_prefix",
                path.display(),
                "must be an absolute path",
            )),
            _ => Ok(()),
        }
    }

    /// Whether `source` may be loaded; the refusal names `url` or `path` and never says whether a
    /// file exists.
    pub fn admits(&self, source: &WeightSource) -> Result<(), InvalidField> {
        if let Some(url) = &source.url
            && !self.url_prefixes.is_empty()
            && !self.url_prefixes.iter().any(|prefix| under_prefix(url, prefix))
        {
            let reason = format!("`{url}` is not under weight_sources.url_prefixes {:?}", self.url_prefixes);
            return Err(InvalidField::new("url", reason));
        }
        if let (Some(path), Some(prefix)) = (&source.path, &self.path_prefix)
            && !within(path, prefix)
        {
            let reason = format!(
                "{} is not a file under weight_sources.path_prefix {}",
                path.display(),
                prefix.display()
            );
            return Err(InvalidField::new("path", reason));
        }
        Ok(())
    }
}

/// Whether `url` starts with `prefix`, its `*` (if any) matching one or more characters of a DNS
/// label.
fn under_prefix(url: &str, prefix: &str) -> bool {
    let Some((head, tail)) = prefix.split_once('*') else { return url.starts_with(prefix) };
    let Some(rest) = url.strip_prefix(head) else { return false };
    let label = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(rest.len());
    (1..=label).any(|end| rest[end..].starts_with(tail))
}

/// Whether `path`, symbolic links resolved, lies under `prefix` (false for a path that does not
/// exist, so the answer tells nothing of the files outside).
fn within(path: &Path, prefix: &Path) -> bool {
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return false;
    }
    match (path.canonicalize(), prefix.canonicalize()) {
        (Ok(path), Ok(prefix)) => path.starts_with(prefix),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(url: Option<&str>, path: Option<&Path>) -> WeightSource {
        WeightSource {
            version: 1,
            url: url.map(Into::into),
            path: path.map(Into::into),
            run: None,
            lora: None,
        }
    }

    #[test]
    fn a_star_stands_for_part_of_one_host_label() {
        let sources = WeightSources {
            url_prefixes: vec!["http://*-trainer.ml.svc:8002/weights/".into()],
            path_prefix: None,
        };
        sources.validate().unwrap();
        for url in ["http://run-trainer.ml.svc:8002/weights/3", "http://a-b-trainer.ml.svc:8002/weights/12"] {
            assert!(sources.admits(&source(Some(url), None)).is_ok(), "{url}");
        }
        for url in [
            "http://-trainer.ml.svc:8002/weights/3",
            "http://x.evil-trainer.ml.svc:8002/weights/3",
            "http://run-trainer.other.svc:8002/weights/3",
            "http://run-trainer.ml.svc:8003/weights/3",
            "http://attacker/?-trainer.ml.svc:8002/weights/3",
            "http://run-trainer.ml.svc:8002/secrets",
        ] {
            assert_eq!(sources.admits(&source(Some(url), None)).unwrap_err().field, "url", "{url}");
        }
        for prefix in ["http://trainer:8002/*/", "http://*.*.svc:8002/weights/"] {
            let bad = WeightSources { url_prefixes: vec![prefix.into()], path_prefix: None };
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains("url_prefixes[0]") && err.contains("one `*`"), "{err}");
        }
    }

    #[test]
    fn only_the_trainer_url_and_the_shared_folder_are_admitted() {
        let shared = tempfile::tempdir().unwrap();
        let inside = shared.path().join("v1.safetensors");
        std::fs::write(&inside, b"w").unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        let escape = shared.path().join("escape");
        std::os::unix::fs::symlink(outside.path(), &escape).unwrap();
        let sources = WeightSources {
            url_prefixes: vec!["http://run-trainer.ml.svc:8002/weights/".into()],
            path_prefix: Some(shared.path().into()),
        };
        sources.validate().unwrap();
        assert!(sources.admits(&source(Some("http://run-trainer.ml.svc:8002/weights/3"), None)).is_ok());
        assert!(sources.admits(&source(None, Some(&inside))).is_ok());
        for (url, path, field) in [
            (Some("http://attacker/evil.safetensors"), None, "url"),
            (Some("http://run-trainer.ml.svc:8002.attacker/weights/3"), None, "url"),
            (None, Some(outside.path()), "path"),
            (None, Some(escape.as_path()), "path"),
            (None, Some(&shared.path().join("../etc/passwd")), "path"),
            (None, Some(Path::new("/etc/passwd")), "path"),
        ] {
            assert_eq!(sources.admits(&source(url, path)).unwrap_err().field, field, "{url:?} {path:?}");
        }
        // A missing file and a file outside read alike.
        let missing = sources.admits(&source(None, Some(&shared.path().join("nope")))).unwrap_err().reason;
        assert!(missing.ends_with(&format!(
            "is not a file under weight_sources.path_prefix {}",
            shared.path().display()
        )));
        assert!(
            WeightSources::default()
                .admits(&source(Some("http://anywhere/w"), Some(Path::new("/x"))))
                .is_ok()
        );
    }

    #[test]
    fn prefixes_are_checked() {
        let bad = WeightSources { url_prefixes: vec!["http://trainer:8002".into()], path_prefix: None };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("weight_sources.url_prefixes[0] = http://trainer:8002")
        );
        let bad = WeightSources { url_prefixes: vec![], path_prefix: Some("shared".into()) };
        assert!(bad.validate().unwrap_err().to_string().starts_with("weight_sources.path_prefix = shared"));
    }
}
