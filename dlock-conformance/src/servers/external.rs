//! The `external` provider: endpoints of running servers from environment variables.

use std::net::{SocketAddr, ToSocketAddrs};

use super::{HarnessError, ServerKind};

/// The addresses named by `kind`'s variable when it is set and lists exactly `nodes` entries.
pub(crate) fn addrs(
    kind: ServerKind,
    nodes: usize,
) -> Result<Option<Vec<SocketAddr>>, HarnessError> {
    let Ok(value) = std::env::var(kind.env_var()) else {
        return Ok(None);
    };
    let entries: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if entries.len() != nodes {
        return Ok(None);
    }
    entries
        .iter()
        .map(|e| {
            parse(e)
                .map_err(|why| HarnessError::BadEnv(format!("{}={value}: {why}", kind.env_var())))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `redis://host:port[/db]`, `http://host:port`, or `host:port` to one socket address.
pub(crate) fn parse(entry: &str) -> Result<SocketAddr, String> {
    let rest = entry.split_once("://").map_or(entry, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    hostport
        .to_socket_addrs()
        .map_err(|e| format!("{entry:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{entry:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_endpoint_form() {
        let want: SocketAddr = "127.0.0.1:6379".parse().expect("literal");
        assert_eq!(parse("redis://127.0.0.1:6379").as_ref(), Ok(&want));
        assert_eq!(parse("redis://:pw@127.0.0.1:6379/0").as_ref(), Ok(&want));
        assert_eq!(parse("http://127.0.0.1:6379").as_ref(), Ok(&want));
        assert_eq!(parse("127.0.0.1:6379").as_ref(), Ok(&want));
        assert!(parse("nonsense").is_err());
    }
}
