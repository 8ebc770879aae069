//! The options every locker builder takes, with one meaning and one check on every backend:
//! the lease TTL, a namespace, TLS roots and client identity, and the labels of the locker's
//! metrics (`metrics_tier`, `metrics_lock_names`).

use std::fmt;
use std::time::Duration;

use crate::Error;
use crate::options::validate_ttl;

/// The longest namespace a builder accepts, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 256;

/// The longest `metrics_tier` label a builder accepts, in bytes.
pub const MAX_METRICS_TIER_LEN: usize = 64;

/// The options every backend's builder embeds. Backends read them through the getters;
/// users set them with the builders' `ttl`, `namespace`, `tls_root_certificates`,
/// `tls_client_identity`, `metrics_tier` and `metrics_lock_names` methods (see
/// [`common_builder_options!`](crate::common_builder_options)).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CommonOptions {
    ttl: Option<Duration>,
    namespace: Option<String>,
    roots: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    metrics_tier: Option<String>,
    metrics_lock_names: bool,
}

impl fmt::Debug for CommonOptions {
    /// Shows whether TLS material is set, never the private key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommonOptions")
            .field("ttl", &self.ttl)
            .field("namespace", &self.namespace)
            .field("tls_root_certificates", &self.roots.is_some())
            .field("tls_client_identity", &self.identity.is_some())
            .field("metrics_tier", &self.metrics_tier)
            .field("metrics_lock_names", &self.metrics_lock_names)
            .finish()
    }
}

impl CommonOptions {
    /// Sets the lease TTL.
    pub fn set_ttl(&mut self, ttl: Duration) {
        self.ttl = Some(ttl);
    }

    /// Sets the namespace; an empty one means none.
    pub fn set_namespace(&mut self, namespace: impl Into<String>) {
        let namespace = namespace.into();
        self.namespace = (!namespace.is_empty()).then_some(namespace);
    }

    /// Sets the trusted root certificates (PEM).
    pub fn set_root_certificates(&mut self, pem: Vec<u8>) {
        self.roots = Some(pem);
    }

    /// Sets the client certificate chain and private key (PEM).
    pub fn set_client_identity(&mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) {
        self.identity = Some((cert_pem, key_pem));
    }

    /// Sets the `tier` label of the locker's metrics; an empty one means none.
    pub fn set_metrics_tier(&mut self, tier: impl Into<String>) {
        let tier = tier.into();
        self.metrics_tier = (!tier.is_empty()).then_some(tier);
    }

    /// Sets whether the locker's per-lock metrics carry a `lock` label (the lock's name).
    pub fn set_metrics_lock_names(&mut self, on: bool) {
        self.metrics_lock_names = on;
    }

    /// The TTL set, or `default`.
    pub fn ttl_or(&self, default: Duration) -> Duration {
        self.ttl.unwrap_or(default)
    }

    /// The namespace, when one is set.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The root certificates, when set.
    pub fn root_certificates(&self) -> Option<&[u8]> {
        self.roots.as_deref()
    }

    /// The client identity (certificate chain, key), when set.
    pub fn client_identity(&self) -> Option<&(Vec<u8>, Vec<u8>)> {
        self.identity.as_ref()
    }

    /// The `tier` label of the locker's metrics, when one is set.
    pub fn metrics_tier(&self) -> Option<&str> {
        self.metrics_tier.as_deref()
    }

    /// Whether the locker's per-lock metrics carry a `lock` label.
    pub fn metrics_lock_names(&self) -> bool {
        self.metrics_lock_names
    }

    /// Whether root certificates or a client identity were given.
    pub fn wants_tls(&self) -> bool {
        self.roots.is_some() || self.identity.is_some()
    }

    /// Checks every common option (no I/O): the TTL set (or `default`), the namespace and
    /// the metrics tier; the TLS material with the `tls` feature, and without it refuses any.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming `ttl`, `namespace`, `metrics_tier`,
    /// `tls_root_certificates` or `tls_client_identity`.
    pub fn validate(&self, default_ttl: Duration) -> Result<(), Error> {
        validate_ttl(self.ttl_or(default_ttl))?;
        if let Some(ns) = &self.namespace {
            validate_namespace(ns)?;
        }
        if let Some(tier) = &self.metrics_tier {
            validate_metrics_tier(tier)?;
        }
        #[cfg(feature = "tls")]
        {
            if let Some(pem) = &self.roots {
                crate::tls::root_certificates(pem)?;
            }
            if let Some((cert, key)) = &self.identity {
                crate::tls::check_identity(cert, key)?;
            }
        }
        #[cfg(not(feature = "tls"))]
        if self.wants_tls() {
            let option = if self.roots.is_some() {
                "tls_root_certificates"
            } else {
                "tls_client_identity"
            };
            return Err(Error::invalid_option(
                option,
                "TLS needs the backend's `tls` feature",
            ));
        }
        Ok(())
    }
}

/// Checks a namespace: segments of `[A-Za-z0-9._-]` joined by `/` (no empty, `.` or `..`
/// segment, so no leading or trailing `/`), at most [`MAX_NAMESPACE_LEN`] bytes.
///
/// # Errors
/// [`Error::InvalidOption`] naming `namespace`.
pub fn validate_namespace(ns: &str) -> Result<(), Error> {
    let bad = |why: String| Error::invalid_option("namespace", format!("{ns:?}: {why}"));
    if ns.len() > MAX_NAMESPACE_LEN {
        return Err(bad(format!(
            "{} bytes is longer than {MAX_NAMESPACE_LEN}",
            ns.len()
        )));
    }
    for seg in ns.split('/') {
        if seg.is_empty() {
            return Err(bad(
                "holds an empty segment (a leading, trailing or doubled '/')".into(),
            ));
        }
        if seg == "." || seg == ".." {
            return Err(bad(format!("segment {seg:?} is not allowed")));
        }
        if let Some(c) = seg
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(bad(format!(
                "character {c:?} is not allowed (segments of [A-Za-z0-9._-] joined by '/')"
            )));
        }
    }
    Ok(())
}

/// Checks a `metrics_tier` label: `[A-Za-z0-9._-]`, 1 to [`MAX_METRICS_TIER_LEN`] bytes.
///
/// # Errors
/// [`Error::InvalidOption`] naming `metrics_tier`.
pub fn validate_metrics_tier(tier: &str) -> Result<(), Error> {
    let bad = |why: String| Error::invalid_option("metrics_tier", format!("{tier:?}: {why}"));
    if tier.is_empty() {
        return Err(bad("is empty".into()));
    }
    if tier.len() > MAX_METRICS_TIER_LEN {
        return Err(bad(format!(
            "{} bytes is longer than {MAX_METRICS_TIER_LEN}",
            tier.len()
        )));
    }
    if let Some(c) = tier
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(bad(format!(
            "character {c:?} is not allowed (only [A-Za-z0-9._-])"
        )));
    }
    Ok(())
}

/// Writes the common builder methods — `ttl`, `namespace`, `tls_root_certificates`,
/// `tls_client_identity`, `metrics_tier`, `metrics_lock_names` — into a builder's `impl` block, over its `common: CommonOptions`
/// field, so every backend's builder offers them with the same words. For backend authors.
///
/// `$default_ttl` is a sentence on the backend's default TTL and how the backend treats the
/// TTL, for the docs.
#[macro_export]
macro_rules! common_builder_options {
    ($default_ttl:literal) => {
        /// The lease TTL: how long a crashed holder can block others,
        /// [`MIN_TTL`](dlock_core::MIN_TTL)..=[`MAX_TTL`](dlock_core::MAX_TTL) (checked by
        /// `validate` and `build`).
        ///
        #[doc = $default_ttl]
        pub fn ttl(mut self, ttl: ::std::time::Duration) -> Self {
            self.common.set_ttl(ttl);
            self
        }

        /// A namespace that keeps applications or tests apart: segments of `[A-Za-z0-9._-]`
        /// joined by `/`; the locker's keys or nodes lie in a sub-tree of that name. Empty
        /// means none. Checked by `validate` and `build`.
        pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
            self.common.set_namespace(namespace);
            self
        }

        /// Trust only these root certificates (PEM, one or more), e.g. a private CA, to verify
        /// the servers' certificates. Checked (parsed, no I/O) by `validate` and `build`.
        pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
            self.common.set_root_certificates(pem.into());
            self
        }

        /// Present this client certificate (PEM chain) and private key (PEM: PKCS #8, PKCS #1
        /// or SEC1) to servers that require client certificates. Checked by `validate` and
        /// `build` (both parse, and the key must go with the certificate); the key never
        /// appears in `Debug` output or errors.
        pub fn tls_client_identity(
            mut self,
            cert_pem: impl Into<Vec<u8>>,
            key_pem: impl Into<Vec<u8>>,
        ) -> Self {
            self.common
                .set_client_identity(cert_pem.into(), key_pem.into());
            self
        }

        /// The `tier` label on every metric of this locker (`dlock-core`'s `metrics`
        /// feature), e.g. the tier of a tiered router: `[A-Za-z0-9._-]`, at most
        /// [`MAX_METRICS_TIER_LEN`](dlock_core::MAX_METRICS_TIER_LEN) bytes. Empty (the
        /// default) means none. Checked by `validate` and `build`, with or without the
        /// feature.
        pub fn metrics_tier(mut self, tier: impl Into<String>) -> Self {
            self.common.set_metrics_tier(tier);
            self
        }

        /// Label this locker's per-lock metrics (grants, releases, losses, timeouts, waits,
        /// hold times) with the lock's name, as `lock` (default off). A cardinality risk:
        /// every distinct name becomes a time series in the metrics backend, so turn it on
        /// only for a small, fixed set of names.
        pub fn metrics_lock_names(mut self, on: bool) -> Self {
            self.common.set_metrics_lock_names(on);
            self
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_follow_one_rule() {
        for good in ["a", "a/b", "app-1/x.y_z"] {
            assert!(validate_namespace(good).is_ok(), "{good}");
        }
        let long = "a".repeat(MAX_NAMESPACE_LEN + 1);
        for bad in ["/a", "a/", "a//b", "a/../b", ".", "a b", "ä", long.as_str()] {
            let e = validate_namespace(bad).expect_err(bad);
            assert!(e.to_string().contains("namespace"), "{e}");
        }
    }

    #[test]
    fn the_common_options_are_checked_and_never_show_the_key() {
        let mut o = CommonOptions::default();
        assert!(o.validate(Duration::from_secs(30)).is_ok());
        o.set_ttl(Duration::ZERO);
        assert!(o.validate(Duration::from_secs(30)).is_err());
        o.set_ttl(Duration::from_secs(1));
        o.set_namespace("");
        assert_eq!(o.namespace(), None);
        o.set_namespace("a//b");
        assert!(o.validate(Duration::from_secs(30)).is_err());
        o.set_namespace("a/b");
        o.set_client_identity(b"cert".to_vec(), b"SECRET-KEY".to_vec());
        assert!(!format!("{o:?}").contains("SECRET"));
        assert!(o.validate(Duration::from_secs(30)).is_err(), "not PEM");
    }

    #[test]
    fn metrics_tiers_are_checked_before_any_io() {
        for good in ["hot", "tier-1", "a.b_c"] {
            assert!(validate_metrics_tier(good).is_ok(), "{good}");
        }
        let long = "t".repeat(MAX_METRICS_TIER_LEN + 1);
        for bad in ["", "a b", "a/b", "t\"", "ä", long.as_str()] {
            let e = validate_metrics_tier(bad).expect_err(bad);
            assert!(e.to_string().contains("metrics_tier"), "{e}");
        }
        let mut o = CommonOptions::default();
        o.set_metrics_tier("");
        assert_eq!(o.metrics_tier(), None, "empty means none");
        o.set_metrics_tier("a b");
        let e = o.validate(Duration::from_secs(30)).expect_err("bad tier");
        assert!(e.to_string().contains("metrics_tier"), "{e}");
        o.set_metrics_tier("hot");
        assert!(o.validate(Duration::from_secs(30)).is_ok());
        assert_eq!(o.metrics_tier(), Some("hot"));
    }
}
