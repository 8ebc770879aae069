//! `dlock-model [--quick] [--model NAME] [--trace]`: explores every case and prints, per model
//! and property, the states explored, depth, time and the result; exits non-zero when a case
//! does not show what it must. `cargo xtask model` runs it at the full bounds.

use std::process::ExitCode;

use dlock_model::{Bound, Expect, Verdict, cases};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bound = if args.iter().any(|a| a == "--quick") {
        Bound::Quick
    } else {
        Bound::Full
    };
    let only = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1));
    let trace = args.iter().any(|a| a == "--trace");
    println!(
        "{:8} {:22} {:13} {:36} {:>10} {:>5} {:>8}  result   bound",
        "model", "variant", "expects", "property", "states", "depth", "time"
    );
    let mut failures = Vec::new();
    for case in cases()
        .into_iter()
        .filter(|c| only.is_none_or(|m| m == c.model))
    {
        let outcome = (case.run)(bound);
        let expects = match case.expect {
            Expect::Holds => "holds".to_owned(),
            Expect::Counterexample(_) => "counterexample".to_owned(),
        };
        for p in &outcome.properties {
            let result = match &p.verdict {
                Verdict::Holds => "holds",
                Verdict::Reached => "reached",
                Verdict::Unreached => "UNREACHED",
                Verdict::Counterexample(_) => "counterexample",
            };
            println!(
                "{:8} {:22} {:13} {:36} {:>10} {:>5} {:>7.1}s  {:8} {}",
                case.model,
                case.variant,
                expects,
                p.name,
                outcome.states,
                outcome.depth,
                outcome.elapsed.as_secs_f64(),
                result,
                outcome.bound
            );
            if let Verdict::Counterexample(steps) = &p.verdict {
                let wanted = case.expect == Expect::Counterexample(p.name);
                if trace || !wanted {
                    println!("    counterexample to `{}`:", p.name);
                    for s in steps {
                        println!("    {s}");
                    }
                }
            }
        }
        if let Err(e) = case.judge(&outcome) {
            failures.push(e);
        }
    }
    if failures.is_empty() {
        println!("every case showed what it must");
        ExitCode::SUCCESS
    } else {
        eprintln!("dlock-model: {}", failures.join("\n"));
        ExitCode::FAILURE
    }
}
