//! The TLS wiring: the common options' PEM roots and client identity as etcd-client's
//! `TlsOptions`, merged with the builder's own [`tls`](crate::EtcdLockerBuilder::tls).

use dlock_core::CommonOptions;
use etcd_client::{Certificate, Identity, TlsOptions};

/// `tls` (the builder's [`tls`](crate::EtcdLockerBuilder::tls)) with the root certificates
/// added and the client identity set; `None` without any TLS option.
pub(crate) fn options(common: &CommonOptions, tls: Option<&TlsOptions>) -> Option<TlsOptions> {
    if tls.is_none() && !common.wants_tls() {
        return None;
    }
    let mut tls = tls.cloned().unwrap_or_default();
    if let Some(pem) = common.root_certificates() {
        tls = tls.ca_certificate(Certificate::from_pem(pem));
    }
    if let Some((cert, key)) = common.client_identity() {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Some(tls)
}
