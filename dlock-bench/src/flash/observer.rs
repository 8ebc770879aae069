//! The observer of the flash-sale workload, independent of every lock: it sees only the
//! critical sections the clients reported (entered when `acquire` returned, exited right
//! before `release`, on the machine's real-time clock) and the writes the resource accepted,
//! and judges them per name. No lock, token or server is consulted.

use std::collections::HashMap;

/// One critical section as reported by its client and the resource.
#[derive(Clone, Debug, Default)]
pub struct Section {
    /// The lock name.
    pub name: String,
    /// The client (process) that held it.
    pub client: usize,
    /// The fencing token the contender handed out, if it has one.
    pub token: Option<u64>,
    /// Real time (ns since the epoch) when `acquire` returned.
    pub enter_ns: u64,
    /// Real time right before `release` was called; `None` when the client never said (it
    /// died in the section): the section is then open until its last request.
    pub exit_ns: Option<u64>,
    /// Real time when the resource took the section's read (its first request, carrying its
    /// token), if it arrived.
    pub read_ns: Option<u64>,
    /// Real time when the resource took the section's write, if it arrived.
    pub write_ns: Option<u64>,
    /// Whether the fenced register accepted the write (`None`: no token, or no write).
    pub fenced_accepted: Option<bool>,
    /// How long the acquire took (waiting included), µs.
    pub acquire_us: u64,
    /// Whether the pause nemesis stopped the client inside this section.
    pub paused: bool,
}

impl Section {
    /// The end of the section: its exit, else its write, else its entry.
    fn end(&self) -> u64 {
        self.exit_ns.or(self.write_ns).unwrap_or(self.enter_ns)
    }
}

/// What the observer concluded from a run's sections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Sections judged.
    pub sections: usize,
    /// Sections that overlapped at least one other section of the same name in real time.
    pub conflicts: usize,
    /// Writes the unfenced register accepted (every write) from a section that a later holder
    /// of the same name had entered before the write arrived.
    pub stale_unfenced: usize,
    /// Of those, the writes the fenced register accepted too although a later holder's token
    /// had already reached the resource (a later holder's read arrived before the write): the
    /// register knew of a later holder and took the write anyway. Only sections with a token.
    pub stale_fenced: usize,
    /// Stale writes the fenced register accepted before any later holder's request reached
    /// it: no resource can refuse these (it has not yet heard of the later holder; Kleppmann's
    /// fencing orders the writes it has seen), so they are counted apart, not as a failure.
    pub stale_unseen: usize,
    /// Sections whose write arrived with a token (the fenced register judged them).
    pub fenced_writes: usize,
    /// Sections the nemesis paused, and of those, the ones a later holder entered before
    /// their write arrived (the pause did what it is for).
    pub paused: usize,
    pub paused_overtaken: usize,
}

/// Judges `sections` (any order).
pub fn judge(sections: &[Section]) -> Verdict {
    let mut by_name: HashMap<&str, Vec<&Section>> = HashMap::new();
    for s in sections {
        by_name.entry(s.name.as_str()).or_default().push(s);
    }
    let mut v = Verdict {
        sections: sections.len(),
        ..Verdict::default()
    };
    for list in by_name.values_mut() {
        list.sort_by_key(|s| (s.enter_ns, s.client));
        let mut conflicted = vec![false; list.len()];
        for i in 0..list.len() {
            // Sorted by entry: the sections entered before this one ends follow it directly.
            let end = list[i].end();
            for j in i + 1..list.len() {
                if list[j].enter_ns >= end {
                    break;
                }
                conflicted[i] = true;
                conflicted[j] = true;
            }
            let s = list[i];
            // Overtaken: the next holder to enter did so before this section's write arrived.
            let overtaken = match (s.write_ns, list.get(i + 1)) {
                (Some(w), Some(next)) => next.enter_ns < w,
                _ => false,
            };
            if s.write_ns.is_some() && s.token.is_some() {
                v.fenced_writes += 1;
            }
            if overtaken {
                v.stale_unfenced += 1;
                // The later holders that entered before this write arrived: did any one's
                // token reach the resource first?
                let w = s.write_ns.unwrap_or(u64::MAX);
                let known = list[i + 1..]
                    .iter()
                    .take_while(|n| n.enter_ns < w)
                    .any(|n| n.read_ns.is_some_and(|r| r < w));
                if s.fenced_accepted == Some(true) {
                    if known {
                        v.stale_fenced += 1;
                    } else {
                        v.stale_unseen += 1;
                    }
                }
            }
            if s.paused {
                v.paused += 1;
                v.paused_overtaken += usize::from(overtaken);
            }
        }
        v.conflicts += conflicted.iter().filter(|c| **c).count();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(name: &str, client: usize, token: u64, span: (u64, u64), write: u64) -> Section {
        Section {
            name: name.to_string(),
            client,
            token: Some(token),
            enter_ns: span.0,
            exit_ns: Some(span.1),
            read_ns: Some(span.0 + 1),
            write_ns: Some(write),
            fenced_accepted: Some(true),
            acquire_us: 1,
            paused: false,
        }
    }

    #[test]
    fn back_to_back_sections_do_not_conflict() {
        let s = [
            section("a", 0, 1, (10, 20), 15),
            section("a", 1, 2, (20, 30), 25),
            // Another name at the same time is no conflict either.
            section("b", 2, 1, (12, 28), 13),
        ];
        let v = judge(&s);
        assert_eq!(
            (v.sections, v.conflicts, v.stale_unfenced),
            (3, 0, 0),
            "{v:?}"
        );
        assert_eq!(v.fenced_writes, 3);
    }

    #[test]
    fn a_paused_holder_overlaps_every_later_section_it_outlives() {
        let mut paused = section("a", 0, 1, (10, 100), 99);
        paused.paused = true;
        paused.fenced_accepted = Some(false);
        let s = [
            paused,
            section("a", 1, 2, (40, 50), 45),
            section("a", 2, 3, (50, 60), 55),
            section("a", 3, 4, (120, 130), 125),
        ];
        let v = judge(&s);
        assert_eq!(v.conflicts, 3, "{v:?}");
        assert_eq!((v.stale_unfenced, v.stale_fenced), (1, 0), "{v:?}");
        assert_eq!((v.paused, v.paused_overtaken), (1, 1), "{v:?}");
    }

    #[test]
    fn a_stale_write_the_fenced_register_took_counts() {
        // The later holder entered (at 40) before the paused holder's write arrived (at 99),
        // and the fenced register accepted it anyway: a fencing failure.
        let s = [
            section("a", 0, 1, (10, 100), 99),
            section("a", 1, 2, (40, 50), 45),
        ];
        let v = judge(&s);
        assert_eq!((v.stale_unfenced, v.stale_fenced), (1, 1), "{v:?}");
        // Without a token the fenced register never judged it.
        let mut untokened = s.clone();
        for x in &mut untokened {
            x.token = None;
            x.fenced_accepted = None;
        }
        let v = judge(&untokened);
        assert_eq!(
            (v.stale_unfenced, v.stale_fenced, v.fenced_writes),
            (1, 0, 0)
        );
    }

    #[test]
    fn a_write_before_any_later_token_reached_the_resource_is_counted_apart() {
        // The later holder entered at 40 but its read reached the resource only at 120, after
        // the earlier holder's write at 99: the register could not know of it.
        let mut later = section("a", 1, 2, (40, 130), 125);
        later.read_ns = Some(120);
        let s = [section("a", 0, 1, (10, 100), 99), later];
        let v = judge(&s);
        assert_eq!(
            (v.stale_unfenced, v.stale_fenced, v.stale_unseen),
            (1, 0, 1),
            "{v:?}"
        );
    }

    #[test]
    fn a_later_holder_with_a_lower_token_lets_the_stale_write_through_and_is_caught() {
        // Tokens out of grant order: the later holder (entered at 40) carries 1, the earlier 5.
        // Its read at 41 leaves the register at 5, so the earlier holder's write at 99 is
        // accepted although the resource had heard of the later holder: a token failure.
        let s = [
            section("a", 0, 5, (10, 100), 99),
            section("a", 1, 1, (40, 50), 45),
        ];
        let v = judge(&s);
        assert_eq!((v.stale_fenced, v.stale_unseen), (1, 0), "{v:?}");
    }

    #[test]
    fn a_section_without_exit_is_open_until_its_write() {
        let mut open = section("a", 0, 1, (10, 0), 70);
        open.exit_ns = None;
        let s = [open, section("a", 1, 2, (60, 65), 62)];
        assert_eq!(judge(&s).conflicts, 2);
    }
}
