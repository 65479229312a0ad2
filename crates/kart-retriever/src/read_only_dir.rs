//! A tantivy [`Directory`] over an index folder that is never written: a serving retriever mounts
//! its index volume read-only, and tantivy's default lock (a file it creates beside the index)
//! cannot be taken there. The index is immutable once built (its manifest records every file's
//! checksum), so readers need no lock; every write fails as the file system would.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tantivy::directory::WritePtr;
use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    Directory, DirectoryLock, FileHandle, Lock, MmapDirectory, WatchCallback, WatchHandle,
};

/// A memory-mapped index folder opened for reading only.
#[derive(Clone, Debug)]
pub struct ReadOnlyDirectory {
    inner: MmapDirectory,
    root: PathBuf,
}

impl ReadOnlyDirectory {
    /// Opens `dir` (which must exist) for reading.
    pub fn open(dir: &Path) -> Result<Self, tantivy::TantivyError> {
        Ok(ReadOnlyDirectory { inner: MmapDirectory::open(dir)?, root: dir.to_path_buf() })
    }

    fn refused(&self, path: &Path) -> io::Error {
        io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            format!("{} is opened read-only", self.root.join(path).display()),
        )
    }
}

impl Directory for ReadOnlyDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        self.inner.get_file_handle(path)
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        Err(DeleteError::IoError { io_error: Arc::new(self.refused(path)), filepath: path.to_path_buf() })
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.inner.exists(path)
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        Err(OpenWriteError::IoError { io_error: Arc::new(self.refused(path)), filepath: path.to_path_buf() })
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.inner.atomic_read(path)
    }

    fn atomic_write(&self, path: &Path, _data: &[u8]) -> io::Result<()> {
        Err(self.refused(path))
    }

    fn sync_directory(&self) -> io::Result<()> {
        Ok(())
    }

    /// No lock: nothing writes the index while it is served.
    fn acquire_lock(&self, _lock: &Lock) -> Result<DirectoryLock, LockError> {
        Ok(DirectoryLock::from(Box::new(())))
    }

    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.inner.watch(watch_callback)
    }
}
