//! The TLS wiring of Redis connections: root certificates and a client identity handed to
//! redis-rs, and the TLS handshake refusals told apart from other connection errors.

use dlock_core::Error;
use redis::{Client, RedisError};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::conn::parse_url;

/// A client identity for TLS: a certificate chain and its private key, both PEM.
pub(crate) type Identity = (Vec<u8>, Vec<u8>);

/// What redis-rs needs for TLS with these roots and identity (`None`: neither given, the
/// system's roots and no client certificate).
pub(crate) fn tls_certificates(
    root_pem: Option<&[u8]>,
    identity: Option<&Identity>,
) -> Option<redis::TlsCertificates> {
    if root_pem.is_none() && identity.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: identity.map(|(cert, key)| redis::ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: root_pem.map(<[u8]>::to_vec),
    })
}

/// Checks a client identity: one or more PEM certificates and a PEM private key. No I/O; the
/// error never quotes the key.
pub(crate) fn check_identity(identity: &Identity) -> Result<(), Error> {
    let (cert, key) = identity;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(cert).collect();
    if !certs.is_ok_and(|c| !c.is_empty()) {
        return Err(Error::invalid_option(
            "tls_client_identity",
            "the certificate is not PEM (-----BEGIN CERTIFICATE-----)",
        ));
    }
    if rustls::pki_types::PrivateKeyDer::from_pem_slice(key).is_err() {
        return Err(Error::invalid_option(
            "tls_client_identity",
            "the key is not a PEM private key (PKCS#8, PKCS#1 or SEC1)",
        ));
    }
    Ok(())
}

/// [`parse_url`], trusting only the PEM root certificates `root_pem` when given (instead of
/// the system's roots) and presenting `identity` when given; both need a `rediss://` URL.
/// No I/O.
pub(crate) fn parse_url_with_roots(
    option: &'static str,
    url: &str,
    root_pem: Option<&[u8]>,
    identity: Option<&Identity>,
) -> Result<Client, Error> {
    let client = parse_url(option, url)?;
    let Some(certs) = tls_certificates(root_pem, identity) else {
        return Ok(client);
    };
    if !matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    ) {
        let option = if root_pem.is_some() {
            "tls_root_certificates"
        } else {
            "tls_client_identity"
        };
        return Err(Error::invalid_option(
            option,
            "TLS options need a rediss:// URL",
        ));
    }
    if let Some(pem) = root_pem {
        check_pem(pem)?;
    }
    if let Some(identity) = identity {
        check_identity(identity)?;
    }
    Client::build_with_tls(url, certs).map_err(|e| {
        Error::invalid_option(
            if identity.is_some() {
                "tls_client_identity"
            } else {
                "tls_root_certificates"
            },
            format!(
                "cannot use the TLS certificates: {}",
                e.detail().unwrap_or("not PEM")
            ),
        )
    })
}

/// Makes sure rustls has a process-wide crypto provider before the first TLS connection: when
/// the final binary enables more than one provider (e.g. `ring` here and `aws-lc-rs`
/// elsewhere), rustls cannot pick one and the client's TLS set-up would panic. Installs `ring`
/// only when no provider is installed yet; an application's own choice is kept.
pub(crate) fn ensure_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Checks PEM root certificates (one or more). No I/O.
pub(crate) fn check_pem(pem: &[u8]) -> Result<(), Error> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
    if certs.is_ok_and(|c| !c.is_empty()) {
        Ok(())
    } else {
        Err(Error::invalid_option(
            "tls_root_certificates",
            "expected one or more PEM certificates",
        ))
    }
}

/// Why a TLS handshake failed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsRefusal {
    /// Our roots do not accept the server's certificate (another CA, another host name,
    /// expired): rustls' "invalid peer certificate".
    ServerCertificate,
    /// The server refused our client certificate (none, another CA's, expired): its alert.
    ClientCertificate,
}

/// The alerts a server sends when it refuses the client's certificate (rustls' names).
const CLIENT_CERTIFICATE_ALERTS: &[&str] = &[
    "received fatal alert: CertificateRequired",
    "received fatal alert: BadCertificate",
    "received fatal alert: UnknownCA",
    "received fatal alert: CertificateUnknown",
    "received fatal alert: CertificateExpired",
    "received fatal alert: UnsupportedCertificate",
    "received fatal alert: HandshakeFailure",
];

/// Whether `e` (or an error it was caused by) is a TLS handshake refused over certificates.
pub(crate) fn tls_refusal(e: &RedisError) -> Option<TlsRefusal> {
    let mut texts = vec![e.to_string()];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        texts.push(s.to_string());
        source = s.source();
    }
    texts.iter().find_map(|t| {
        if t.contains("invalid peer certificate") {
            Some(TlsRefusal::ServerCertificate)
        } else if CLIENT_CERTIFICATE_ALERTS.iter().any(|a| t.contains(a)) {
            Some(TlsRefusal::ClientCertificate)
        } else {
            None
        }
    })
}
