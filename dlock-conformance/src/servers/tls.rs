//! TLS for test servers: a private CA, a server certificate for 127.0.0.1 / localhost and a
//! client identity, generated with `openssl` when a TLS cluster starts (nothing committed, so
//! nothing expires), and the harness' own TLS client for readiness probes and counters.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{HarnessError, ServerKind};

/// How long the generated certificates are valid (from the moment they are made).
const VALID_DAYS: &str = "7";

/// The certificate files of a TLS cluster.
///
/// Local clusters get fresh ones in their temp dir (`ca.crt`, `server.crt`/`server.key`,
/// `client.crt`/`client.key`, all PEM; the CA's key is kept there too). External TLS servers
/// name theirs with `DLOCK_<KIND>_TLS_CA` (and optionally `…_TLS_CERT` + `…_TLS_KEY`, a client
/// identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    ca: PathBuf,
    client: Option<(PathBuf, PathBuf)>,
    server: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// The CA bundle (PEM) that signed the servers' certificates: what clients trust.
    pub fn ca(&self) -> &Path {
        &self.ca
    }

    /// The CA bundle's PEM text.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub fn ca_pem(&self) -> io::Result<Vec<u8>> {
        std::fs::read(&self.ca)
    }

    /// The client identity (certificate, key), PEM files, signed by the same CA (the servers
    /// accept it where they check client certificates).
    pub fn client_identity(&self) -> Option<(&Path, &Path)> {
        self.client
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The server's certificate and key (local clusters only).
    pub fn server_identity(&self) -> Option<(&Path, &Path)> {
        self.server
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The variables that make the external provider (a child process) use these files.
    pub(crate) fn env(&self, kind: ServerKind) -> Vec<(String, String)> {
        let [ca, cert, key] = kind.tls_env_vars();
        let mut out = vec![(ca.to_string(), path_str(&self.ca))];
        if let Some((c, k)) = &self.client {
            out.push((cert.to_string(), path_str(c)));
            out.push((key.to_string(), path_str(k)));
        }
        out
    }

    /// The files named by `kind`'s `DLOCK_<KIND>_TLS_*` variables; `None` when the CA variable
    /// is unset.
    pub(crate) fn from_env(kind: ServerKind) -> Result<Option<TlsFiles>, HarnessError> {
        let [ca, cert, key] = kind.tls_env_vars();
        let Some(ca_path) = std::env::var_os(ca) else {
            return Ok(None);
        };
        let client = match (std::env::var_os(cert), std::env::var_os(key)) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(HarnessError::BadEnv(format!(
                    "{cert} and {key} name a client identity together: set both or neither"
                )));
            }
        };
        Ok(Some(TlsFiles {
            ca: PathBuf::from(ca_path),
            client,
            server: None,
        }))
    }

    /// A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, made
    /// with `openssl` in `dir` (created).
    pub(crate) fn generate(dir: &Path) -> Result<TlsFiles, HarnessError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| HarnessError::Io(format!("cannot create {}: {e}", dir.display())))?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt", "-days", VALID_DAYS]);
        ca.extend(["-subj", "/CN=dlock test CA"]);
        openssl(dir, &ca)?;
        for (name, cn, ext) in [
            (
                "server",
                "/CN=127.0.0.1",
                // Also a client certificate: etcd dials itself with it (its gRPC gateway).
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),
            (
                "client",
                "/CN=dlock-test-client",
                "extendedKeyUsage=clientAuth\n",
            ),
        ] {
            let (key, csr, crt, extfile) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            let mut req = vec!["req"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", cn]);
            openssl(dir, &req)?;
            std::fs::write(dir.join(&extfile), ext).map_err(|e| {
                HarnessError::Io(format!(
                    "cannot write {}: {e}",
                    dir.join(&extfile).display()
                ))
            })?;
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    VALID_DAYS,
                    "-extfile",
                    &extfile,
                ],
            )?;
        }
        Ok(TlsFiles {
            ca: dir.join("ca.crt"),
            client: Some((dir.join("client.crt"), dir.join("client.key"))),
            server: Some((dir.join("server.crt"), dir.join("server.key"))),
        })
    }

    /// The harness' client configuration: trusts the CA, presents the client identity when
    /// there is one.
    pub(crate) fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, HarnessError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            HarnessError::Io(format!("TLS client set-up: {what}: {e}"))
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.ca)
            .map_err(|e| bad(&format!("cannot read {}", self.ca.display()), &e))?
        {
            let cert = cert.map_err(|e| bad(&format!("{}", self.ca.display()), &e))?;
            roots
                .add(cert)
                .map_err(|e| bad(&format!("{}", self.ca.display()), &e))?;
        }
        // An explicit provider: the process default stays the application's (the tests') own.
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("protocol versions", &e))?
        .with_root_certificates(roots);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| bad(&format!("cannot read {}", cert.display()), &e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(&format!("{}", cert.display()), &e))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| bad(&format!("cannot read {}", key.display()), &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("client identity", &e))?
            }
        };
        Ok(Arc::new(config))
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), HarnessError> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| HarnessError::Io(format!("cannot run openssl {args:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Io(format!(
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// How the harness itself talks to a node: plain TCP, or TLS with the cluster's CA (and
/// client identity).
#[derive(Clone, Default)]
pub(crate) enum Transport {
    /// Plain TCP.
    #[default]
    Plain,
    /// TLS with this configuration.
    Tls(Arc<rustls::ClientConfig>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Plain => "Plain",
            Transport::Tls(_) => "Tls",
        })
    }
}

/// A connected stream: plain or TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

impl Transport {
    /// Connects to `addr` with `timeout` on the connect, every read and every write.
    pub(crate) fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<Stream> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        match self {
            Transport::Plain => Ok(Stream::Plain(s)),
            Transport::Tls(config) => {
                let name = ServerName::IpAddress(addr.ip().into());
                let conn = rustls::ClientConnection::new(Arc::clone(config), name)
                    .map_err(io::Error::other)?;
                Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(conn, s))))
            }
        }
    }

    /// Sends `request` to `addr` over a fresh connection and reads the reply until the server
    /// closes it (or 2 s pass). `None` when the server does not answer.
    pub(crate) fn read_text(&self, addr: SocketAddr, request: &[u8]) -> Option<String> {
        let mut s = self.connect(addr, Duration::from_secs(2)).ok()?;
        s.write_all(request).ok()?;
        s.flush().ok()?;
        let mut out = Vec::new();
        match s.read_to_end(&mut out) {
            Ok(_) => {}
            Err(_) if !out.is_empty() => {}
            Err(_) => return None,
        }
        Some(String::from_utf8_lossy(&out).into_owned())
    }
}
