//! The secrets-leak detector: every form a password or a private key could take in text
//! (`Debug` output, errors, traces), and the check that none shows.

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;

use super::{debug_bytes, hex};

/// The secrets of one test and the forms in which each could leak.
#[derive(Debug, Default, Clone)]
pub struct Secrets {
    /// (what, a form of it).
    forms: Vec<(String, String)>,
}

impl Secrets {
    /// No secrets yet.
    pub fn new() -> Self {
        Secrets::default()
    }

    /// A password: its text, its bytes as `{:?}` prints a byte slice, and its hex.
    #[must_use]
    pub fn password(mut self, what: &str, pw: &str) -> Self {
        self.forms.push((what.into(), pw.into()));
        self.forms
            .push((format!("{what} (bytes)"), debug_bytes(pw.as_bytes())));
        self.forms
            .push((format!("{what} (hex)"), hex(pw.as_bytes())));
        self
    }

    /// A PEM private key: every base64 line of its body, a run of its PEM bytes as `{:?}`
    /// prints a byte slice, and windows across its DER bytes as `{:?}` prints them and in hex.
    ///
    /// # Panics
    /// When `pem` is no PEM private key (a broken test).
    #[must_use]
    pub fn pem_key(mut self, what: &str, pem: &[u8]) -> Self {
        let text = String::from_utf8_lossy(pem).into_owned();
        for line in text
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        {
            self.forms
                .push((format!("{what} (PEM line)"), line.to_string()));
        }
        // The PEM text itself as `{:?}` prints a byte slice (a PEM kept as bytes).
        let mid = pem.len() / 2;
        self.forms.push((
            format!("{what} (bytes)"),
            debug_bytes(&pem[mid..(mid + 24).min(pem.len())]),
        ));
        let der = PrivateKeyDer::from_pem_slice(pem).expect("a PEM private key");
        let der = der.secret_der();
        // The private scalar lies past the first header bytes: windows across the whole key.
        for start in (8..der.len().saturating_sub(16)).step_by(8) {
            let window = &der[start..start + 16];
            self.forms
                .push((format!("{what} (bytes)"), debug_bytes(window)));
            self.forms.push((format!("{what} (hex)"), hex(window)));
        }
        self
    }

    /// The secrets (with the form) that occur in `text`.
    pub fn leaks(&self, text: &str) -> Vec<&str> {
        self.forms
            .iter()
            .filter(|(_, form)| text.contains(form.as_str()))
            .map(|(what, _)| what.as_str())
            .collect()
    }

    /// Fails when `text` (found in `place`) contains a secret.
    ///
    /// # Panics
    /// When it does, naming the place, the secret and the form.
    pub fn assert_hidden(&self, place: &str, text: &str) {
        let leaks = self.leaks(text);
        assert!(leaks.is_empty(), "{place} shows {leaks:?}:\n{text}");
    }

    /// Fails when `err` shows a secret in its `Display`, `Debug` or alternate `Debug` form, or
    /// in any error of its `source()` chain.
    ///
    /// # Panics
    /// As [`Secrets::assert_hidden`].
    pub fn assert_error_hidden(&self, place: &str, err: &(dyn std::error::Error + 'static)) {
        let mut text = format!("{err}\n{err:?}\n{err:#?}");
        let mut source = err.source();
        while let Some(s) = source {
            text.push_str(&format!("\n{s}\n{s:?}"));
            source = s.source();
        }
        self.assert_hidden(place, &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shows its secret only through its `source()`.
    struct Wrapping(std::io::Error);

    impl std::fmt::Debug for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Wrapping")
        }
    }

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapping")
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    #[should_panic(expected = "shows [\"pw\"]")]
    fn a_secret_in_an_errors_source_chain_is_found() {
        let err = Wrapping(std::io::Error::other("login as user:Sekr3t-Value"));
        Secrets::new()
            .password("pw", "Sekr3t-Value")
            .assert_error_hidden("the error", &err);
    }

    #[test]
    fn every_form_of_a_password_is_found_and_nothing_else() {
        let s = Secrets::new().password("pw", "Sekr3t-Value");
        assert_eq!(s.leaks("user:Sekr3t-Value@host"), vec!["pw"]);
        let bytes = format!("{:?}", b"xSekr3t-Valuex");
        assert_eq!(s.leaks(&bytes), vec!["pw (bytes)"]);
        assert_eq!(s.leaks(&hex(b"Sekr3t-Value")), vec!["pw (hex)"]);
        assert!(s.leaks("user:*****@host").is_empty());
    }
}
