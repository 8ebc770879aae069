//! Runs one model to its bound and judges the outcome: every property holds (and every
//! `sometimes` property found an example, so the model is not vacuous), or — for a negative
//! control — the named property has a counterexample.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, Model};

/// How far a case explores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The bound `cargo xtask test` runs (every case together in well under 3 minutes).
    Quick,
    /// The stated bound `cargo xtask model` runs.
    Full,
}

/// What a case must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every `always` and `eventually` property holds within the bound, and every `sometimes`
    /// property has an example.
    Holds,
    /// The named property has a counterexample (a negative control: a deliberately broken
    /// variant the checker must catch).
    Counterexample(&'static str),
}

/// What the checker said about one property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `always` / `eventually`: no counterexample within the bound.
    Holds,
    /// `sometimes`: an example exists (the model reaches what the property names).
    Reached,
    /// `sometimes`: no example within the bound — the model never gets there (vacuous).
    Unreached,
    /// `always` / `eventually`: a counterexample, as the steps that lead to it.
    Counterexample(Vec<String>),
}

/// One property's line in the report.
#[derive(Debug, Clone)]
pub struct PropertyOutcome {
    /// The property's name, as the model declares it.
    pub name: &'static str,
    /// What the checker found.
    pub verdict: Verdict,
}

/// The result of exploring one case.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The bound, in the model's own words (clients, nodes, horizon, faults).
    pub bound: String,
    /// Unique states explored.
    pub states: usize,
    /// The deepest path explored.
    pub depth: usize,
    /// Wall-clock time of the exploration.
    pub elapsed: Duration,
    /// Every property of the model.
    pub properties: Vec<PropertyOutcome>,
}

/// A model variant and what it must show.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The protocol (`redis`, `redlock`, `etcd`, `zk`, `lease`).
    pub model: &'static str,
    /// `today…` for the code as it is (`today, fair`: its fair configuration); otherwise the
    /// broken variant a negative control runs.
    pub variant: &'static str,
    /// What the exploration must show.
    pub expect: Expect,
    /// Explores the variant to the bound.
    pub run: fn(Bound) -> Outcome,
}

impl Case {
    /// A case of the code as it is (`variant` starts with `today`): every property must hold.
    pub const fn holds(
        model: &'static str,
        variant: &'static str,
        run: fn(Bound) -> Outcome,
    ) -> Self {
        Case {
            model,
            variant,
            expect: Expect::Holds,
            run,
        }
    }

    /// A negative control: `property` must have a counterexample.
    pub const fn control(
        model: &'static str,
        variant: &'static str,
        property: &'static str,
        run: fn(Bound) -> Outcome,
    ) -> Self {
        Case {
            model,
            variant,
            expect: Expect::Counterexample(property),
            run,
        }
    }

    /// Explores the case and says whether it showed what it must (`Err` says what it did
    /// not).
    ///
    /// # Errors
    ///
    /// A property of a `Holds` case with a counterexample or an unreached `sometimes`; a
    /// negative control whose property held.
    pub fn judge(&self, outcome: &Outcome) -> Result<(), String> {
        let who = format!("{} / {}", self.model, self.variant);
        match self.expect {
            Expect::Holds => {
                let bad: Vec<String> = outcome
                    .properties
                    .iter()
                    .filter(|p| {
                        matches!(p.verdict, Verdict::Unreached | Verdict::Counterexample(_))
                    })
                    .map(|p| match &p.verdict {
                        Verdict::Counterexample(steps) => {
                            format!("{}: counterexample\n    {}", p.name, steps.join("\n    "))
                        }
                        _ => format!("{}: never reached (the model is vacuous there)", p.name),
                    })
                    .collect();
                if bad.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{who}: {}", bad.join("\n")))
                }
            }
            Expect::Counterexample(name) => {
                match outcome.properties.iter().find(|p| p.name == name) {
                    Some(PropertyOutcome {
                        verdict: Verdict::Counterexample(_),
                        ..
                    }) => Ok(()),
                    Some(_) => Err(format!(
                        "{who}: the negative control found no counterexample to `{name}`"
                    )),
                    None => Err(format!("{who}: the model has no property `{name}`")),
                }
            }
        }
    }
}

/// Explores `model` breadth-first (on every core) until every state within its boundary is
/// seen, and reports each property. `bound` describes the boundary for the report.
pub fn explore<M>(model: M, bound: String) -> Outcome
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync,
    M::Action: Clone + Debug + PartialEq + Send + Sync,
{
    let properties = model.properties();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let checker = model.checker().threads(threads).spawn_bfs().join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let properties = properties
        .iter()
        .map(|p| {
            let found = discoveries.get(p.name);
            let verdict = match (&p.expectation, found) {
                (Expectation::Sometimes, Some(_)) => Verdict::Reached,
                (Expectation::Sometimes, None) => Verdict::Unreached,
                (_, None) => Verdict::Holds,
                (_, Some(path)) => {
                    let steps = path
                        .clone()
                        .into_actions()
                        .iter()
                        .enumerate()
                        .map(|(i, a)| format!("{:>3}. {a:?}", i + 1))
                        .collect();
                    Verdict::Counterexample(steps)
                }
            };
            PropertyOutcome {
                name: p.name,
                verdict,
            }
        })
        .collect();
    Outcome {
        bound,
        states: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        properties,
    }
}
