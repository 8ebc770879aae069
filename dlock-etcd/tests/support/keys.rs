//! The keys under a namespace, listed for the conformance backend's audits (`backend.rs`) and
//! for the other tests (`mod.rs`), which include this file each.

use dlock_etcd::etcd_client::{Client, Error, GetOptions};

/// Every key under `ns/`, sorted.
pub async fn list(c: &mut Client, ns: &str) -> Result<Vec<String>, Error> {
    let resp = c
        .get(
            format!("{ns}/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?;
    let mut keys: Vec<String> = resp
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    keys.sort();
    Ok(keys)
}
