//! The operator's stateful fake API server over HTTP on loopback, with a kubeconfig pointing at it.

use kart_operator::testing::fake_apiserver::FakeApiServer;
use std::path::{Path, PathBuf};

/// The fake API server, serving until dropped.
pub struct ApiServer {
    /// The server's state, for in-process clients and injected failures.
    pub server: FakeApiServer,
    /// A kubeconfig whose current context is this server, default namespace `namespace`.
    pub kubeconfig: PathBuf,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ApiServer {
    /// Serves an empty API on a free loopback port; writes `dir/kubeconfig.yaml`.
    pub async fn start(dir: &Path, namespace: &str) -> std::io::Result<ApiServer> {
        let server = FakeApiServer::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(server.clone().serve(listener));
        let kubeconfig = dir.join("kubeconfig.yaml");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\n\
                 clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
                 users: [{{name: fake, user: {{}}}}]\n\
                 contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {namespace}}}}}]\n\
                 current-context: fake\n"
            ),
        )?;
        Ok(ApiServer { server, kubeconfig, task })
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
