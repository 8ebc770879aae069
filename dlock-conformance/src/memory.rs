//! The in-process memory backend as a [`TestBackend`]: the reference the suite is proven on,
//! and (with a [`Defect`]) the broken variants that prove each checker can fail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dlock_core::memory::Defect;
use dlock_core::{Error, FencingToken, LockName, Locker, MemoryLocker, MemoryServer};

use crate::{ClientOptions, ServerExpiry, TestBackend};

/// Memory lockers sharing one [`MemoryServer`] per namespace (so namespaces are isolated the
/// way key prefixes isolate them at a real server).
pub struct MemoryBackend {
    name: String,
    defect: Option<Defect>,
    servers: Mutex<HashMap<String, Arc<MemoryServer>>>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("name", &self.name)
            .field("defect", &self.defect)
            .finish()
    }
}

impl MemoryBackend {
    /// The correct memory backend, reported as `memory`.
    pub fn new() -> Self {
        MemoryBackend {
            name: "memory".into(),
            defect: None,
            servers: Mutex::new(HashMap::new()),
        }
    }

    /// A deliberately broken variant, reported as `memory-<defect>`; only for proving checkers.
    pub fn with_defect(defect: Defect) -> Self {
        MemoryBackend {
            name: format!("memory-{defect:?}").to_lowercase(),
            defect: Some(defect),
            servers: Mutex::new(HashMap::new()),
        }
    }

    fn locker(&self, opts: &ClientOptions) -> Result<MemoryLocker, Error> {
        let mut builder = MemoryLocker::builder()
            .ttl(opts.ttl)
            .server(self.server(&opts.namespace));
        if let Some(d) = self.defect {
            builder = builder.defect(d);
        }
        builder.build()
    }

    fn server(&self, namespace: &str) -> Arc<MemoryServer> {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(servers.entry(namespace.to_string()).or_default())
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

#[async_trait]
impl TestBackend for MemoryBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        Vec::new()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        Ok(Arc::new(self.locker(&opts)?))
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        Ok(self.server(namespace).entries(""))
    }

    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        let server = self.server(namespace);
        crate::history::deleting_now();
        Ok(server.expire_now(name).map(|token| vec![token]))
    }

    /// Read at the shared server, exact to the instant (resolution zero).
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let server = self.server(namespace);
        Ok(match server.holder_expiry(name) {
            Some(expires) => ServerExpiry::Remaining {
                remaining: expires.saturating_duration_since(tokio::time::Instant::now()),
                resolution: std::time::Duration::ZERO,
            },
            None => ServerExpiry::NoHolder,
        })
    }

    fn child_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}
