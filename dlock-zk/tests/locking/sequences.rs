//! Sequence order after the parent's cversion wraps.
//!
//! ZooKeeper names a sequential node with `%010d` of its parent's cversion, a signed 32-bit
//! count of child creates and deletes: after 2147483647 comes `-2147483648`. The wrap takes
//! 2^31 child changes through the client API (days of a busy lock), so
//! [`every_primitive_keeps_creation_order_across_a_real_wrap`] starts its own server from a
//! snapshot whose lock parents' cversion is already 2^31 - 1, written with the server's own
//! classes (`DataTree::setCversionPzxid`, `FileTxnSnapLog::save`): the next child created
//! there gets the last positive sequence, the one after it the first negative.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Zk, children_become, contenders, eventually, kept_out, locker, raw};
use crate::{TTL, wait};
use dlock_conformance::servers::local::ZK_JAR;
use dlock_core::{AcquireOptions, Election, LockName, Locker, RwLocker, Semaphore};

/// A node named as after a wrap (created by name in a parent whose cversion is small) is, in
/// serial-number arithmetic, just before the sequences the parent gives now: it is ahead of
/// ours (as it is for Curator, which sorts such names first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_named_after_a_cversion_wrap_is_ahead_of_ours() {
    let Some(zk) = Zk::new("wrap") else { return };
    let (l, name, parent, z) = zk.on_lock("wrapped", TTL).await;
    let l = Arc::new(l);
    let open = zookeeper_client::Acls::anyone_all();
    z.mkdir(
        &parent,
        &zookeeper_client::CreateMode::Persistent.with_acls(open),
    )
    .await
    .unwrap();
    let wrapped = format!("{parent}/_c_0b9e6a77-3c1d-4b4f-9d6e-4f1f2f3a4b5c-lock--000000005");
    z.create(
        &wrapped,
        b"",
        &zookeeper_client::CreateMode::Ephemeral.with_acls(open),
    )
    .await
    .unwrap();

    assert!(
        l.try_acquire(&name).await.unwrap().is_none(),
        "granted while a node Curator sorts first exists"
    );
    let (l2, n2) = (Arc::clone(&l), name.clone());
    let waiting = tokio::spawn(async move {
        l2.acquire(&n2, AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    assert!(
        children_become(&z, &parent, 2, Duration::from_secs(5)).await,
        "our contender did not queue"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted ahead of the wrapped node");
    z.delete(&wrapped, None).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted once the wrapped node is gone")
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
    assert!(contenders(&z, &parent).await.is_empty());
}

/// Writes a snapshot in which each path exists with its parent's cversion at `cversion`.
const SNAPSHOT_WRITER: &str = r#"
import java.io.File;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.server.DataTree;
import org.apache.zookeeper.server.persistence.FileTxnSnapLog;

public class WrapSnapshot {
    public static void main(String[] args) throws Exception {
        File dir = new File(args[0]);
        int cversion = Integer.parseInt(args[1]);
        DataTree tree = new DataTree();
        long zxid = 0;
        for (int i = 2; i < args.length; i++) {
            String path = "";
            for (String seg : args[i].substring(1).split("/")) {
                path = path + "/" + seg;
                if (tree.getNode(path) == null) {
                    zxid++;
                    tree.createNode(path, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, 0, -1, zxid,
                        System.currentTimeMillis());
                }
            }
            tree.setCversionPzxid(args[i], cversion, zxid);
        }
        tree.lastProcessedZxid = zxid;
        new FileTxnSnapLog(dir, dir).save(tree, new ConcurrentHashMap<>(), true);
    }
}
"#;

/// A standalone ZooKeeper server of this test, started from a written snapshot (killed and its
/// directory removed on drop).
struct WrapServer {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

impl Drop for WrapServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn classpath() -> String {
    let mut cp = ZK_JAR.to_owned();
    if Path::new("/usr/share/java/slf4j-simple.jar").exists() {
        cp.push_str(":/usr/share/java/slf4j-simple.jar");
    }
    cp
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run the JDK");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts a server whose `parents` (and their ancestors) exist, each with cversion `cversion`.
/// `None` (printed) when the JDK or ZooKeeper is missing outside CI.
async fn wrap_server(cversion: i32, parents: &[&str]) -> Option<WrapServer> {
    let installed = Path::new(ZK_JAR).exists()
        && ["java", "javac"].iter().all(|tool| {
            Command::new(tool)
                .arg("-version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        });
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "ZooKeeper or the JDK is not installed (CI must have them)"
        );
        eprintln!("SKIP: ZooKeeper or the JDK is not installed");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("dlock-zk-wrap-{}-{port}", std::process::id()));
    let (src, data) = (dir.join("src"), dir.join("data"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let java = src.join("WrapSnapshot.java");
    std::fs::write(&java, SNAPSHOT_WRITER).unwrap();
    run(Command::new("javac")
        .args(["-cp", ZK_JAR, "-d"])
        .arg(&src)
        .arg(&java));
    run(Command::new("java")
        .arg("-cp")
        .arg(format!("{}:{}", classpath(), src.display()))
        .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        .arg("WrapSnapshot")
        .arg(&data)
        .arg(cversion.to_string())
        .args(parents));
    let cfg = dir.join("zoo.cfg");
    std::fs::write(
        &cfg,
        format!(
            "tickTime=100\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             maxClientCnxns=0\nminSessionTimeout=200\nmaxSessionTimeout=60000\n\
             admin.enableServer=false\n4lw.commands.whitelist=*\nforceSync=no\n",
            data.display()
        ),
    )
    .unwrap();
    let child = Command::new("java")
        .args([
            "-Xms32m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            &classpath(),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
        ])
        .arg(&cfg)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = WrapServer {
        child,
        dir,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    let addr = server.addr;
    assert!(
        eventually(Duration::from_secs(60), || async move {
            tokio::task::spawn_blocking(move || dlock_conformance::read_text(addr, b"ruok"))
                .await
                .unwrap()
                .is_some_and(|r| r.starts_with("imok"))
        })
        .await,
        "the ZooKeeper server started from the snapshot did not come up"
    );
    Some(server)
}

/// The sequence suffixes of `parent`'s children.
async fn suffixes(z: &zookeeper_client::Client, parent: &str, marker: &str) -> Vec<String> {
    contenders(z, parent)
        .await
        .iter()
        .filter_map(|c| c.rsplit_once(marker).map(|(_, seq)| seq.to_owned()))
        .collect()
}

/// Whether every suffix is one ZooKeeper gives once the parent's cversion reached 2^31 - 1:
/// `2147483647` again (ZooKeeper 3.8 keeps the cversion there), or negative (a server that
/// wraps, or a create made while another was pending).
fn past_the_end(suffixes: &[String]) -> bool {
    suffixes
        .iter()
        .all(|s| s == "2147483647" || s.starts_with('-'))
}

/// A node created from outside as the holder, in `parent` with `marker`: its uuid sorts after
/// any other, so it is behind ours if a tie of suffixes is broken by name. Returns its path and
/// czxid.
async fn outside_holder(
    z: &zookeeper_client::Client,
    parent: &str,
    marker: &str,
    data: &[u8],
) -> (String, u64) {
    let prefix = format!("{parent}/_c_ffffffff-ffff-4fff-bfff-ffffffffffff-{marker}");
    let (stat, seq) = z
        .create(
            &prefix,
            data,
            &zookeeper_client::CreateMode::EphemeralSequential
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    assert_eq!(
        seq.to_string(),
        "2147483647",
        "the parent's cversion is at 2^31 - 1"
    );
    (format!("{prefix}{seq}"), u64::try_from(stat.czxid).unwrap())
}

fn briefly() -> AcquireOptions {
    AcquireOptions::wait(Duration::from_millis(500))
}

/// On a server whose lock parents' cversion is 2^31 - 1, a holder's node gets the sequence
/// `2147483647`, and so does every later node (or a negative one): the later contender must
/// wait for the holder — mutex, read-write lock, semaphore permit and election alike — and is
/// granted once it goes, with a larger fencing token (the czxid, which the cversion does not
/// touch). The holder's uuid sorts last, so ordering ties by name would grant the contender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_keeps_creation_order_past_the_end_of_the_sequence() {
    let ns = "wrap";
    let parent = |name: &str| format!("/dlock/{ns}/{name}");
    let leases = format!("{}/leases", parent("sem"));
    let Some(server) = wrap_server(
        i32::MAX,
        &[
            &parent("mutex"),
            &parent("rw"),
            &leases,
            &parent("election"),
        ],
    )
    .await
    else {
        return;
    };
    let connect = server.addr.to_string();
    let (a, b) = (
        locker(&connect, ns, TTL).await,
        Arc::new(locker(&connect, ns, TTL).await),
    );
    let z = raw(&connect).await;

    // Mutex.
    let name = LockName::new("mutex").unwrap();
    assert_eq!(b.lock_path(&name), parent("mutex"));
    let (holder, czxid) = outside_holder(&z, &parent("mutex"), "lock-", b"").await;
    assert!(
        b.try_acquire(&name).await.unwrap().is_none(),
        "a second holder was granted past the end of the sequence"
    );
    let waiting = tokio::spawn({
        let (b, name) = (Arc::clone(&b), name.clone());
        async move { b.acquire(&name, wait()).await }
    });
    assert!(
        children_become(&z, &parent("mutex"), 2, Duration::from_secs(5)).await,
        "the waiter did not queue"
    );
    let seqs = suffixes(&z, &parent("mutex"), "-lock-").await;
    assert!(past_the_end(&seqs), "{seqs:?}");
    assert!(!waiting.is_finished(), "granted ahead of the holder");
    z.delete(&holder, None).await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    assert!(
        next.token().get() > czxid,
        "{:?} after {czxid}",
        next.token()
    );
    next.release().await.unwrap();

    // Read-write lock: a reader after the writer waits for it.
    let name = LockName::new("rw").unwrap();
    let (writer, czxid) = outside_holder(&z, &parent("rw"), "__WRIT__", b"").await;
    kept_out(
        b.read(&name, briefly()).await,
        "a reader was granted beside the writer",
    );
    z.delete(&writer, None).await.unwrap();
    let reader = b.read(&name, wait()).await.unwrap();
    assert!(reader.token().get() > czxid);
    reader.release().await.unwrap();

    // Semaphore of one permit: no second permit.
    let name = LockName::new("sem").unwrap();
    let (permit, czxid) = outside_holder(&z, &leases, "lease-", b"").await;
    kept_out(
        b.acquire_permit(&name, 1, briefly()).await,
        "a permit beyond N was granted",
    );
    z.delete(&permit, None).await.unwrap();
    let second = b.acquire_permit(&name, 1, wait()).await.unwrap();
    assert!(second.token().get() > czxid);
    second.release().await.unwrap();

    // Election: the leader stays the older campaign, for `leader()` and for an observer, until
    // it resigns.
    let name = LockName::new("election").unwrap();
    let (leader, czxid) = outside_holder(&z, &parent("election"), "latch-", b"before").await;
    let campaign = tokio::spawn({
        let (b, name) = (Arc::clone(&b), name.clone());
        async move { b.campaign(&name, b"after", wait()).await }
    });
    assert!(
        children_become(&z, &parent("election"), 2, Duration::from_secs(5)).await,
        "the second campaign did not queue"
    );
    let mut changes = a.observe(&name).await.unwrap();
    let first = changes.next().await.unwrap();
    assert_eq!((first.term.get(), first.value), (czxid, b"before".to_vec()));
    let read = a.leader(&name).await.unwrap().unwrap();
    assert_eq!((read.term.get(), read.value), (czxid, b"before".to_vec()));
    assert!(!campaign.is_finished(), "a second leader");
    z.delete(&leader, None).await.unwrap();
    let lb = campaign.await.unwrap().unwrap();
    let then = tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("the observer reports the next leader")
        .unwrap();
    assert_eq!((then.term, then.value), (lb.term(), b"after".to_vec()));
    assert!(lb.term().get() > czxid);
    lb.resign().await.unwrap();
}
