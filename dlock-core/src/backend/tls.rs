//! TLS material checked one way for every backend (PEM roots and a client identity, parsed
//! and matched with rustls, no I/O), the crypto provider every backend installs, and the one
//! list of TLS alerts that mean a server refused our certificate.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// Installs rustls' `ring` provider as the process default unless one is installed already
/// (an application's own choice is kept). Never panics.
pub fn ensure_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Parses PEM root certificates (one or more).
///
/// # Errors
/// [`Error::InvalidOption`] naming `tls_root_certificates` when the bytes hold no PEM
/// certificate, or one rustls cannot use as a root.
pub fn root_certificates(pem: &[u8]) -> Result<rustls::RootCertStore, Error> {
    let bad = |why: String| Error::invalid_option("tls_root_certificates", why);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("expected one or more PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            "expected one or more PEM certificates (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable root certificate: {e}")))?;
    }
    Ok(roots)
}

/// Parses a client identity: a PEM certificate chain and a PEM private key (PKCS #8, PKCS #1
/// or SEC1) that goes with its first certificate.
///
/// # Errors
/// [`Error::InvalidOption`] naming `tls_client_identity`; the message never quotes the key.
pub fn client_identity(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let bad = |why: String| Error::invalid_option("tls_client_identity", why);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("the certificate is not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(bad(
            "the certificate is not PEM (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    // The key's own parse error never quotes the key, but say nothing of it all the same.
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| bad("the key is not a PEM private key (PKCS #8, PKCS #1 or SEC1)".into()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|_| bad("the private key cannot be used for signing".into()))?;
    rustls::sign::CertifiedKey::new(chain.clone(), signing)
        .keys_match()
        .map_err(|e| bad(format!("the certificate and key do not go together: {e}")))?;
    Ok((chain, key))
}

/// [`client_identity`] without its result.
///
/// # Errors
/// As [`client_identity`].
pub fn check_identity(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), Error> {
    client_identity(cert_pem, key_pem).map(|_| ())
}

/// The TLS alerts (rustls' names) a server sends when it refuses the client's certificate,
/// or the lack of one.
pub const REFUSAL_ALERTS: [&str; 9] = [
    "CertificateRequired",
    "BadCertificate",
    "UnknownCA",
    "CertificateUnknown",
    "CertificateExpired",
    "CertificateRevoked",
    "UnsupportedCertificate",
    "AccessDenied",
    "HandshakeFailure",
];

/// The refusal alert received somewhere in `error`'s chain (its text or its sources'), as
/// `received fatal alert: <name>`; `None` when the error is no certificate refusal.
pub fn refusal_alert(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(alert) = refusal_in(&e.to_string()) {
            return Some(alert);
        }
        next = e.source();
    }
    None
}

/// The refusal alert named in a message, as [`refusal_alert`] reads one error's text.
pub fn refusal_in(message: &str) -> Option<&'static str> {
    let (_, rest) = message.split_once("received fatal alert: ")?;
    let name: String = rest
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    REFUSAL_ALERTS.into_iter().find(|a| *a == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_pem_is_refused_naming_the_option() {
        let e = root_certificates(b"nothing").expect_err("no PEM");
        assert!(e.to_string().contains("tls_root_certificates"), "{e}");
        let e = check_identity(b"nothing", b"SECRET").expect_err("no PEM");
        assert!(e.to_string().contains("tls_client_identity"), "{e}");
        assert!(!e.to_string().contains("SECRET"), "{e}");
    }

    #[test]
    fn refusals_are_read_from_the_alert_names_only() {
        assert_eq!(
            refusal_in("transport error: received fatal alert: UnknownCA"),
            Some("UnknownCA")
        );
        assert_eq!(refusal_in("received fatal alert: DecodeError"), None);
        assert_eq!(refusal_in("connection refused"), None);
        let io = std::io::Error::other("tls: received fatal alert: CertificateRequired");
        assert_eq!(refusal_alert(&io), Some("CertificateRequired"));
    }
}
