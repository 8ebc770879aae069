//! TLS for ZooKeeper sessions: the client crate's TLS options from the checked trust and
//! identity, and the handshake of our own that explains a refused TLS connect (the client
//! crate reports only a timeout).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::backend::tls::{client_identity, refusal_alert, root_certificates};
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use zookeeper_client as zk;

use crate::keys::connect_hosts;

/// Validated TLS settings: the client crate's options, and the same trust and identity as a
/// rustls configuration of our own, to explain a failed handshake.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) options: zk::TlsOptions,
    config: Arc<rustls::ClientConfig>,
    /// Whether a client certificate is presented (for `Debug`).
    pub(crate) client_identity: bool,
}

/// Why one member's handshake failed, when it is a certificate problem.
enum Refusal {
    /// We do not trust the server's certificate (or it names another host).
    ServerCertificate(String),
    /// The server refused our client certificate (or the lack of one).
    ClientCertificate(String),
}

impl Tls {
    /// Builds the TLS settings from PEM text, checked by core's `backend::tls`.
    pub(crate) fn new(
        roots_pem: &[u8],
        identity: Option<&(Vec<u8>, Vec<u8>)>,
    ) -> Result<Tls, Error> {
        let roots_err = |why: String| Error::invalid_option("tls_root_certificates", why);
        let id_err = |why: String| Error::invalid_option("tls_client_identity", why);
        // The client crate reads PEM text; core's parse accepted these bytes as PEM.
        let mut options = zk::TlsOptions::new()
            .with_pem_ca(&String::from_utf8_lossy(roots_pem))
            .map_err(|e| roots_err(format!("{e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| roots_err(format!("{e}")))?
            .with_root_certificates(root_certificates(roots_pem)?);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert_pem, key_pem)) => {
                let (chain, key) = client_identity(cert_pem, key_pem)?;
                options = options
                    .with_pem_identity(
                        &String::from_utf8_lossy(cert_pem),
                        &String::from_utf8_lossy(key_pem),
                    )
                    .map_err(|_| id_err("expected a PEM certificate and private key".into()))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    id_err(format!("the certificate and key do not go together: {e}"))
                })?
            }
        };
        Ok(Tls {
            options,
            config: Arc::new(config),
            client_identity: identity.is_some(),
        })
    }

    /// Handshakes with every TLS member of `connect` (each bounded by a fifth of
    /// `session_timeout`): `Some` error saying why when every member failed over
    /// certificates; `None` when one accepted us or failed for another reason (down, slow, not
    /// all members use TLS).
    pub(crate) async fn explain(&self, connect: &str, session_timeout: Duration) -> Option<Error> {
        let all = connect_hosts(connect);
        let hosts: Vec<String> = all
            .iter()
            .filter_map(|h| h.strip_prefix("tcp+tls://").map(str::to_owned))
            .collect();
        if hosts.is_empty() || hosts.len() != all.len() {
            return None;
        }
        let within = session_timeout / 5;
        // A server that accepted the handshake refuses a client certificate right after it
        // (TLS 1.3): wait that long for its verdict.
        let verdict =
            (session_timeout / 10).clamp(Duration::from_millis(100), Duration::from_millis(500));
        let mut checks = tokio::task::JoinSet::new();
        let identity = self.client_identity;
        for host in hosts {
            let config = Arc::clone(&self.config);
            checks.spawn(async move {
                let why = tokio::time::timeout(within, refusal(config, &host, verdict, identity))
                    .await
                    .ok()
                    .flatten();
                (host, why)
            });
        }
        let mut reasons = Vec::new();
        let mut client_refused = true;
        while let Some(done) = checks.join_next().await {
            match done {
                Ok((host, Some(Refusal::ServerCertificate(why)))) => {
                    client_refused = false;
                    reasons.push(format!("{host}: {why}"));
                }
                Ok((host, Some(Refusal::ClientCertificate(why)))) => {
                    reasons.push(format!("{host}: {why}"));
                }
                _ => return None,
            }
        }
        let message = format!(
            "ZooKeeper connect: TLS handshake refused by every member ({}); check \
             tls_root_certificates, tls_client_identity and that the connect string names the \
             hosts the server certificates were issued for",
            reasons.join("; ")
        );
        tracing::warn!(%message, "ZooKeeper TLS handshake failed");
        Some(if client_refused {
            Error::access_denied(message, None)
        } else {
            Error::backend(message, None)
        })
    }
}

/// One handshake with `host` (`host:port`, `[v6]:port`): `Some` when it fails over
/// certificates. After a handshake that completes, waits up to `verdict` for the server's
/// verdict on our certificate (TLS 1.3 servers refuse a client certificate after the client
/// finished; a server that accepted it waits for our first request). `identity`: whether we
/// present a client certificate.
async fn refusal(
    config: Arc<rustls::ClientConfig>,
    host: &str,
    verdict: Duration,
    identity: bool,
) -> Option<Refusal> {
    let (name, port) = host.rsplit_once(':')?;
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok()?;
    let server_name = ServerName::try_from(name.to_owned()).ok()?;
    let tcp = tokio::net::TcpStream::connect((name, port)).await.ok()?;
    let mut tls = match tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await
    {
        Ok(tls) => tls,
        Err(e) => return classify(&e, identity),
    };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(verdict, tls.read(&mut byte)).await {
        Ok(Err(e)) => classify(&e, identity),
        Ok(Ok(_)) | Err(_) => None,
    }
}

/// The certificate problem an I/O error of a handshake carries, if any (`identity`: whether
/// we presented a client certificate): a server certificate we do not accept, or one of core's
/// refusal alerts ([`REFUSAL_ALERTS`](dlock_core::backend::tls::REFUSAL_ALERTS)).
///
/// A JVM server (OpenJDK 17.0.19 under ZooKeeper's Netty factory) answers a missing client
/// certificate with a bare `handshake_failure` alert during the handshake, where 17.0.15 let
/// the handshake finish and then sent `certificate_required`. Without an identity of ours that
/// alert is read as the missing certificate; with one, as a refusal of the handshake (our
/// certificate, or nothing in common), reported as the server's.
fn classify(e: &std::io::Error, identity: bool) -> Option<Refusal> {
    if let Some(rustls::Error::InvalidCertificate(why)) =
        e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        return Some(Refusal::ServerCertificate(format!(
            "the server's certificate is not accepted: {why:?}"
        )));
    }
    match refusal_alert(e)? {
        "HandshakeFailure" if !identity => Some(Refusal::ClientCertificate(
            "the server refused the handshake (alert HandshakeFailure): it requires a client certificate, and none is configured (tls_client_identity)".into(),
        )),
        "HandshakeFailure" => Some(Refusal::ServerCertificate(
            "the server refused the handshake (alert HandshakeFailure): it refused our client certificate, or we share no protocol version or cipher suite".into(),
        )),
        alert => Some(Refusal::ClientCertificate(format!(
            "the server refused our client certificate (alert {alert})"
        ))),
    }
}
