//! The `containers` provider: image and port configuration of each server kind for
//! testcontainers. Used where a Docker engine answers and the local binaries are absent.

use std::net::SocketAddr;

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};

use super::{HarnessError, ServerKind};

/// How to run one node of a server kind in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// Image name.
    pub image: &'static str,
    /// Image tag.
    pub tag: &'static str,
    /// The container port clients connect to.
    pub client_port: u16,
    /// The command line (after the image's entrypoint).
    pub cmd: Vec<String>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// A line the server logs once it is ready.
    pub ready_line: &'static str,
}

/// The single-node container configuration for `kind`.
pub fn spec(kind: ServerKind) -> ContainerSpec {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    match kind {
        ServerKind::Redis => ContainerSpec {
            image: "redis",
            tag: "7.0",
            client_port: 6379,
            cmd: s(&["redis-server", "--save", "", "--appendonly", "no"]),
            env: Vec::new(),
            ready_line: "Ready to accept connections",
        },
        ServerKind::Etcd => ContainerSpec {
            image: "quay.io/coreos/etcd",
            tag: "v3.4.23",
            client_port: 2379,
            cmd: s(&[
                "etcd",
                "--name",
                "n0",
                "--listen-client-urls",
                "http://0.0.0.0:2379",
                "--advertise-client-urls",
                "http://127.0.0.1:2379",
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--unsafe-no-fsync",
            ]),
            env: Vec::new(),
            ready_line: "ready to serve client requests",
        },
        ServerKind::Zk => ContainerSpec {
            image: "zookeeper",
            tag: "3.8",
            client_port: 2181,
            cmd: Vec::new(),
            env: vec![
                ("ZOO_TICK_TIME".into(), "100".into()),
                ("ZOO_4LW_COMMANDS_WHITELIST".into(), "*".into()),
                ("ZOO_ADMINSERVER_ENABLED".into(), "false".into()),
                (
                    "ZOO_CFG_EXTRA".into(),
                    "minSessionTimeout=200 maxSessionTimeout=60000".into(),
                ),
            ],
            ready_line: "binding to port",
        },
    }
}

/// The testcontainers request for one node of `kind`.
pub fn request(kind: ServerKind) -> ContainerRequest<GenericImage> {
    let spec = spec(kind);
    let image = GenericImage::new(spec.image, spec.tag)
        .with_exposed_port(spec.client_port.tcp())
        .with_wait_for(if kind == ServerKind::Etcd {
            WaitFor::message_on_stderr(spec.ready_line)
        } else {
            WaitFor::message_on_stdout(spec.ready_line)
        });
    let mut req = if spec.cmd.is_empty() {
        ContainerRequest::from(image)
    } else {
        image.with_cmd(spec.cmd.clone())
    };
    for (k, v) in spec.env {
        req = req.with_env_var(k, v);
    }
    req
}

/// Whether a Docker engine answers (the socket exists or `DOCKER_HOST` is set).
pub fn docker_available() -> bool {
    std::env::var_os("DOCKER_HOST").is_some()
        || std::path::Path::new("/var/run/docker.sock").exists()
}

/// Starts one node of `kind` in a container; returns it (stopped when dropped) and the host
/// address of its client port.
///
/// # Errors
/// [`HarnessError::Io`] when the engine cannot start it.
pub async fn start(
    kind: ServerKind,
) -> Result<(ContainerAsync<GenericImage>, SocketAddr), HarnessError> {
    let container = request(kind)
        .start()
        .await
        .map_err(|e| HarnessError::Io(format!("cannot start a {kind} container: {e}")))?;
    let port = container
        .get_host_port_ipv4(spec(kind).client_port.tcp())
        .await
        .map_err(|e| HarnessError::Io(format!("{kind} container has no mapped port: {e}")))?;
    Ok((container, SocketAddr::from(([127, 0, 0, 1], port))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_pinned_image_and_its_client_port() {
        assert_eq!(spec(ServerKind::Redis).client_port, 6379);
        assert_eq!(spec(ServerKind::Etcd).client_port, 2379);
        assert_eq!(spec(ServerKind::Zk).client_port, 2181);
        for kind in [ServerKind::Redis, ServerKind::Etcd, ServerKind::Zk] {
            let s = spec(kind);
            assert!(
                !s.tag.is_empty() && s.tag != "latest",
                "{kind}: pin the tag"
            );
            assert!(!s.ready_line.is_empty());
        }
        assert!(
            spec(ServerKind::Redis)
                .cmd
                .windows(2)
                .any(|w| w == ["--appendonly", "no"])
        );
        assert!(
            spec(ServerKind::Etcd)
                .cmd
                .iter()
                .any(|a| a == "--election-timeout")
        );
        assert!(
            spec(ServerKind::Zk)
                .env
                .iter()
                .any(|(k, v)| k == "ZOO_CFG_EXTRA" && v.contains("maxSessionTimeout"))
        );
    }

    #[test]
    fn requests_carry_the_spec() {
        use testcontainers::Image;
        for kind in [ServerKind::Redis, ServerKind::Etcd, ServerKind::Zk] {
            let s = spec(kind);
            let req = request(kind);
            assert_eq!(req.image().name(), s.image);
            assert_eq!(req.image().tag(), s.tag);
            assert_eq!(req.image().expose_ports(), [s.client_port.tcp()]);
            assert_eq!(
                req.cmd().map(|c| c.into_owned()).collect::<Vec<_>>(),
                s.cmd,
                "{kind}"
            );
            let env: Vec<(String, String)> = req
                .env_vars()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            for pair in &s.env {
                assert!(env.contains(pair), "{kind}: {pair:?} missing from {env:?}");
            }
            assert_eq!(req.ready_conditions().len(), 1);
        }
    }
}
