//! Everything traced in the process, captured: a global subscriber that writes every span and
//! event of every crate at every level with all its fields (`Debug` of each value), for tests
//! that check what the library and the crates under it log.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// The text traced so far in this process. The first call installs the capturing subscriber
/// as the global default; call it before the code under test runs.
///
/// # Panics
/// When another global subscriber was installed first (one per test binary).
pub fn captured() -> String {
    static OUT: OnceLock<Arc<Mutex<String>>> = OnceLock::new();
    let out = OUT.get_or_init(|| {
        let out = Arc::new(Mutex::new(String::new()));
        tracing::subscriber::set_global_default(Capture {
            out: Arc::clone(&out),
            next: AtomicU64::new(1),
        })
        .expect("no other global subscriber in this test binary");
        out
    });
    out.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// `[1, 2, 3]` as `{:?}` prints it, without the brackets (so it matches inside a longer slice).
pub fn debug_bytes(b: &[u8]) -> String {
    let s = format!("{b:?}");
    s.trim_start_matches('[').trim_end_matches(']').to_string()
}

/// The bytes in lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

struct Capture {
    out: Arc<Mutex<String>>,
    next: AtomicU64,
}

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Capture {
    fn write(&self, head: String, record: impl FnOnce(&mut Fields<'_>)) {
        let mut line = head;
        record(&mut Fields(&mut line));
        line.push('\n');
        self.out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_str(&line);
    }
}

impl Subscriber for Capture {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::always()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let m = span.metadata();
        self.write(
            format!("SPAN {} {} {}", m.level(), m.target(), m.name()),
            |f| span.record(f),
        );
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.write(format!("RECORD {}", span.into_u64()), |f| values.record(f));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let m = event.metadata();
        self.write(format!("{} {}", m.level(), m.target()), |f| event.record(f));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
