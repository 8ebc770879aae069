//! Finds the server binaries the suite needs, and installs them where that is possible.

use std::path::Path;
use std::process::Command;

/// What the suite needs, as (what, how to find it, Debian package).
const NEEDS: &[(&str, &str, &str)] = &[
    ("redis-server", "/usr/bin/redis-server", "redis-server"),
    ("etcd", "/usr/bin/etcd", "etcd-server"),
    ("etcdctl", "/usr/bin/etcdctl", "etcd-client"),
    ("ZooKeeper", "/usr/share/java/zookeeper.jar", "zookeeper"),
    ("protoc", "/usr/bin/protoc", "protobuf-compiler"),
];

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(bin).is_file()))
}

fn present(what: &str, path: &str) -> bool {
    Path::new(path).exists() || (!path.ends_with(".jar") && on_path(what))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Installs missing server packages with apt-get when running as root on a Debian-like machine;
/// otherwise says exactly what to run.
pub fn ensure_servers() -> Result<(), String> {
    let missing: Vec<&(&str, &str, &str)> = NEEDS
        .iter()
        .filter(|(what, path, _)| !present(what, path))
        .collect();
    if missing.is_empty() {
        eprintln!(
            "xtask: server binaries present (redis-server, etcd, etcdctl, ZooKeeper, protoc)"
        );
        return Ok(());
    }
    let pkgs: Vec<&str> = missing.iter().map(|(_, _, p)| *p).collect();
    let command = format!(
        "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y {}",
        pkgs.join(" ")
    );
    if !(on_path("apt-get") && is_root()) {
        return Err(format!(
            "missing: {}. Install them with:\n  sudo sh -c '{command}'",
            missing
                .iter()
                .map(|(w, _, _)| *w)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    eprintln!(
        "xtask: installing missing server packages: {}",
        pkgs.join(" ")
    );
    let status = Command::new("sh")
        .arg("-c")
        .arg(&command)
        .status()
        .map_err(|e| format!("could not run apt-get: {e}"))?;
    if !status.success() {
        return Err(format!("`{command}` failed ({status})"));
    }
    Ok(())
}
