//! The private working directory of a call without bubblewrap.

use super::{SandboxError, UserIds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A call's private working directory, removed on drop.
pub(super) struct WorkDir(PathBuf);

impl WorkDir {
    /// Makes `kart-python-{pid}-{n}` under `root`, mode 0700, owned by `owner` when given.
    pub(super) fn create(root: &Path, owner: Option<UserIds>) -> Result<Self, SandboxError> {
        use std::os::unix::fs::DirBuilderExt;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path =
            root.join(format!("kart-python-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let fail = |source| SandboxError::WorkDir { path: path.clone(), source };
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(fail)?;
        let dir = WorkDir(path.clone());
        if let Some(ids) = owner {
            std::os::unix::fs::chown(&path, Some(ids.uid), Some(ids.gid)).map_err(fail)?;
        }
        Ok(dir)
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0) {
            let path = self.0.display();
            tracing::warn!(%path, %error, "could not remove a python sandbox work directory");
        }
    }
}
