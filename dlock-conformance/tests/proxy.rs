//! The fault proxy passes, blackholes, resets and delays, per direction, switchable live.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use dlock_conformance::faults::{Direction, Mode, Proxy};

/// An echo server on a free port; returns its address.
fn echo_server() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(msg)?;
    let mut buf = vec![0u8; msg.len()];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

fn connect(p: &Proxy) -> TcpStream {
    let s = TcpStream::connect(p.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(400)))
        .expect("timeout");
    s
}

#[test]
fn pass_blackhole_pass_on_one_connection() {
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    assert_eq!(roundtrip(&mut s, b"hello").expect("pass"), b"hello");
    p.set(Mode::Blackhole);
    let err = roundtrip(&mut s, b"held!").expect_err("nothing passes a blackhole");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err}"
    );
    p.set(Mode::Pass);
    // The connection stayed open through the blackhole, and nothing was lost (TCP semantics):
    // the held request and its reply arrive once the link heals, before the next one.
    assert_eq!(
        roundtrip(&mut s, b"again").expect("pass after blackhole"),
        b"held!"
    );
    let mut rest = [0u8; 5];
    s.read_exact(&mut rest).expect("the next reply");
    assert_eq!(&rest, b"again");
    assert_eq!(p.connections(), 1);
    assert!(p.bytes(Direction::Upstream) >= 15);
}

#[test]
fn blackhole_then_reset_loses_the_held_reply() {
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    p.set_direction(Direction::Downstream, Mode::Blackhole);
    assert!(roundtrip(&mut s, b"req").is_err(), "the reply is held");
    p.set(Mode::Reset);
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = [0u8; 3];
    let r = s.read(&mut buf);
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "the held reply must be discarded by the reset: {r:?}"
    );
}

#[test]
fn downstream_only_blackhole_lets_requests_through() {
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    assert_eq!(roundtrip(&mut s, b"x").expect("pass"), b"x");
    std::thread::sleep(Duration::from_millis(50)); // the proxy counts after its write
    let down_before = p.bytes(Direction::Downstream);
    p.set_direction(Direction::Downstream, Mode::Blackhole);
    assert_eq!(p.mode(Direction::Upstream), Mode::Pass);
    assert!(roundtrip(&mut s, b"req").is_err(), "the reply must be lost");
    assert!(
        p.bytes(Direction::Upstream) >= 4,
        "the request went through"
    );
    assert_eq!(p.bytes(Direction::Downstream), down_before);
}

#[test]
fn reset_closes_open_and_new_connections() {
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    assert_eq!(roundtrip(&mut s, b"x").expect("pass"), b"x");
    p.set(Mode::Reset);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        roundtrip(&mut s, b"y").is_err(),
        "a reset connection must fail"
    );
    let mut t = connect(&p);
    assert!(
        roundtrip(&mut t, b"z").is_err(),
        "new connections are reset too"
    );
    p.set(Mode::Pass);
    let mut u = connect(&p);
    assert_eq!(roundtrip(&mut u, b"ok").expect("pass again"), b"ok");
}

#[test]
fn delay_adds_latency() {
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    p.set_direction(Direction::Upstream, Mode::Delay(Duration::from_millis(200)));
    let t = Instant::now();
    assert_eq!(roundtrip(&mut s, b"slow").expect("delayed"), b"slow");
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
}

/// A delay is a latency, not a queue: bytes read while earlier ones are still in flight
/// arrive one delay after they were read, not one delay after the earlier ones arrived.
#[test]
fn delayed_bytes_in_flight_do_not_queue_behind_each_other() {
    const DELAY: Duration = Duration::from_millis(500);
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    p.set_direction(Direction::Upstream, Mode::Delay(DELAY));
    s.write_all(b"a").expect("send");
    // Sent while the first byte is in flight: due one delay after it, 20 ms later.
    std::thread::sleep(Duration::from_millis(20));
    let sent = Instant::now();
    s.write_all(b"b").expect("send");
    let mut echoed = [0u8; 2];
    s.read_exact(&mut echoed).expect("both echoed");
    assert_eq!(&echoed, b"ab", "order kept");
    let took = sent.elapsed();
    // A proxy that forwards one read per delay delivers the second byte about two delays
    // after it was sent (1 s); the slack covers a loaded machine.
    assert!(took >= DELAY - Duration::from_millis(5), "{took:?}");
    assert!(
        took < DELAY + Duration::from_millis(300),
        "a byte sent behind another one in flight took {took:?} under a {DELAY:?} delay"
    );
}

#[test]
fn drop_closes_connections() {
    let p = Proxy::start(echo_server()).expect("proxy");
    let mut s = connect(&p);
    assert_eq!(roundtrip(&mut s, b"x").expect("pass"), b"x");
    drop(p);
    let mut buf = [0u8; 1];
    let r = s.write_all(b"y").and_then(|()| s.read(&mut buf));
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
}
