//! The TLS wiring of Redis connections: the common options' roots and client identity handed
//! to redis-rs (checked by core), and the TLS handshake refusals told apart from other
//! connection errors.

use dlock_core::backend::tls::refusal_in;
use dlock_core::{BoxError, CommonOptions, Error};
use redis::{Client, RedisError};

use crate::conn::parse_url;

/// What redis-rs needs for TLS with the roots and client identity given (`None`: neither, the
/// system's roots and no client certificate).
pub(crate) fn certificates(common: &CommonOptions) -> Option<redis::TlsCertificates> {
    common.wants_tls().then(|| redis::TlsCertificates {
        client_tls: common
            .client_identity()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: common.root_certificates().map(<[u8]>::to_vec),
    })
}

/// The TLS option to name when TLS material is given where no TLS is used.
pub(crate) fn option_given(common: &CommonOptions) -> &'static str {
    if common.root_certificates().is_some() {
        "tls_root_certificates"
    } else {
        "tls_client_identity"
    }
}

/// [`parse_url`], with the roots and client identity of `common` when given (they need a
/// `rediss://` URL). No I/O.
pub(crate) fn client(
    option: &'static str,
    url: &str,
    common: &CommonOptions,
) -> Result<Client, Error> {
    let client = parse_url(option, url)?;
    let Some(certs) = certificates(common) else {
        return Ok(client);
    };
    if !matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    ) {
        return Err(Error::invalid_option(
            option_given(common),
            "TLS options need a rediss:// URL",
        ));
    }
    Client::build_with_tls(url, certs).map_err(|e| {
        Error::invalid_option(
            if common.client_identity().is_some() {
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

/// The error for a TLS handshake refused over certificates, `None` for any other error:
/// retrying the same connection cannot help, so neither is retryable (an acquire fails at once
/// instead of retrying until its wait ends). Our roots not accepting the server's certificate
/// (rustls' "invalid peer certificate") is a `Backend` error; the server refusing our client
/// certificate (one of core's refusal alerts) is `AccessDenied`.
pub(crate) fn refused(node: &str, what: &str, e: &RedisError) -> Option<Error> {
    let source = || Some(Box::new(e.clone()) as BoxError);
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if text.contains("invalid peer certificate") {
            return Some(Error::backend(
                format!(
                    "{what} on {node}: TLS: the server's certificate is not accepted (check \
                     tls_root_certificates and that the certificate names the URL's host): {e}"
                ),
                source(),
            ));
        }
        if refusal_in(&text).is_some() {
            return Some(Error::access_denied(
                format!(
                    "{what} on {node}: TLS: the server refused our client certificate (check \
                     tls_client_identity): {e}"
                ),
                source(),
            ));
        }
        next = err.source();
    }
    None
}
