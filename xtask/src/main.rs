//! Project automation: `cargo xtask test | conform | bench | model | servers`.
//!
//! Every command here only orchestrates cargo and the server binaries; the logic under test lives
//! in the crates.

use std::process::{Command, ExitCode};

mod allowlist;
mod bench;
mod cargo_json;
mod conform;
mod gates;
mod install;
mod listing;
mod prod;
mod tidy;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test                 fmt check, clippy -D warnings, every test (conformance included), docs,
                       the protocol models at their quick bounds, a 1-minute fault soak and a
                       quick bench run
  conform [--backend memory,redis,...] [--json FILE] [--soak 10m [--seed N]]
                       run the conformance scenarios against real servers and print the table
                       (--from DIR: judge rows a run wrote to $DLOCK_REPORT_DIR=DIR instead)
  bench [--quick] [--backend ...] [--json FILE]
                       dlock vs the raw server floor vs peer libraries, in one run
  bench --readme FILE [--from RESULTS_JSON]
                       rewrite FILE's generated performance section from a run's rows
  model [--quick] [--model NAME] [--trace]
                       explore every protocol model (dlock-model) to its stated bound and print,
                       per model and property, states, depth, time and the verdict
  servers              check (and where possible install) the server binaries the suite needs
  enrolled             the backends the test binaries enrol and how many scenarios each runs
                       (what `test` judges the conformance rows against)
  gates                the publishing gates (a step of `test`): `cargo +MSRV check`, dlock-any's
                       features one at a time, dlock-etcd without tls, crates.io and docs.rs
                       metadata, license texts, `cargo package` of every publishable crate
  tidy                 workspace rules: `//!` module docs, ARCHITECTURE.md a map of every
                       crate, backend crates independent, test hooks behind `testing`,
                       crate roots
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("conform")
            if args
                .iter()
                .any(|a| a == "--from" || a.starts_with("--from=")) =>
        {
            conform::run(&args[1..])
        }
        Some("conform") => install::ensure_servers().and_then(|()| conform::run(&args[1..])),
        Some("bench") => install::ensure_servers().and_then(|()| bench::run(&args[1..])),
        Some("model") => step(
            "model",
            cargo()
                .args(["run", "-q", "-p", "dlock-model", "--"])
                .args(&args[1..]),
        ),
        Some("servers") => install::ensure_servers(),
        Some("tidy") => tidy::run(&conform::workspace_root()),
        Some("gates") => gates::run(&conform::workspace_root()),
        Some("enrolled") => enrolled(),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints what the workspace's test binaries enrol (as `cargo xtask test` reads it).
fn enrolled() -> Result<(), String> {
    let listing = listing::Listing::ask_workspace(&conform::workspace_root())?;
    let all = listing.scenarios(&conform::BACKENDS);
    let mut dropped = Vec::new();
    for b in &conform::BACKENDS {
        if listing.enrolled(b) {
            let n = listing.scenarios(std::slice::from_ref(b)).len();
            println!("{:18} {n} scenarios", b.name);
        } else {
            println!("{:18} NOT ENROLLED", b.name);
            dropped.push(*b);
        }
    }
    println!(
        "{} scenarios in all: {}",
        all.len(),
        all.into_iter().collect::<Vec<_>>().join(" ")
    );
    let failures = conform::enrolment_failures(&dropped);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Runs one step; fails with the step's name.
fn step(name: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n==> {name}: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("step `{name}` could not start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("step `{name}` failed ({status})"))
    }
}

/// Runs `cmd` to its end and returns its stdout. A command that cannot start fails as
/// `<cannot>: <error>`; one that exits unsuccessfully as `<failed> (<status>):` and its stderr.
fn captured(cmd: &mut Command, cannot: &str, failed: &str) -> Result<Vec<u8>, String> {
    let out = cmd.output().map_err(|e| format!("{cannot}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{failed} ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out.stdout)
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// cargo at a lower CPU priority (`nice -n 10`), for compile-only steps that run beside tests.
fn nice_cargo() -> Command {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "10"])
        .arg(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd
}

/// The compile-only checks: clippy, the containers provider, the docs (the publishing gates
/// run beside the test step, see [`Gates`]).
fn compile_checks() -> Result<(), String> {
    step(
        "clippy",
        nice_cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // No Docker engine is needed to keep the containers provider compiling.
    step(
        "check containers provider",
        nice_cargo().args([
            "check",
            "-p",
            "dlock-conformance",
            "--features",
            "containers",
            "--tests",
        ]),
    )?;
    step(
        "doc",
        nice_cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )
}

/// The publishing gates ([`gates::run`]) in a child `cargo xtask gates` at nice 19, beside the
/// test step: its scenarios mostly sleep on TTLs and leave about half the CPU idle, which a
/// compiler at nice 19 takes without delaying them. Its output goes to a log, printed once it
/// ends.
struct Gates {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Gates {
    fn start(root: &std::path::Path) -> Result<Gates, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find xtask itself: {e}"))?;
        let log =
            std::env::temp_dir().join(format!("dlock-xtask-gates-{}.log", std::process::id()));
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot open {} twice: {e}", log.display()))?;
        eprintln!(
            "\n==> gates (beside the test step, nice 19; output in {})",
            log.display()
        );
        let child = Command::new("nice")
            .args(["-n", "19"])
            .arg(exe)
            .arg("gates")
            .current_dir(root)
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("step `gates` could not start: {e}"))?;
        Ok(Gates { child, log })
    }

    /// Waits for the gates, prints their output, and fails when they failed.
    fn finish(mut self) -> Result<(), String> {
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for the gates: {e}"))?;
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log);
        eprintln!("\n==> gates (output)\n{out}");
        if status.success() {
            Ok(())
        } else {
            Err(format!("step `gates` failed ({status})"))
        }
    }
}

fn test() -> Result<(), String> {
    install::ensure_servers()?;
    step("fmt", cargo().args(["fmt", "--all", "--check"]))?;
    eprintln!("\n==> tidy");
    tidy::run(&conform::workspace_root())?;
    // Every conformance row lands in a report dir, judged below exactly as `cargo xtask
    // conform` judges them: CI sees the same table, allowlist and missing rows.
    let report_dir = std::env::temp_dir().join(format!("dlock-xtask-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&report_dir);
    std::fs::create_dir_all(&report_dir)
        .map_err(|e| format!("cannot create {}: {e}", report_dir.display()))?;
    // Build every test binary first, so the production-settings rows (long leases, little
    // CPU) run beside the compile-only steps, which yield the CPU to them (nice 10).
    step(
        "build tests",
        cargo().args(["test", "--workspace", "--no-run"]),
    )?;
    let prod = prod::start(&conform::workspace_root(), &report_dir)?;
    let compiled = compile_checks();
    let prod_ran = prod.wait();
    compiled?;
    // Scenarios mostly sleep on TTLs: run many at once on this 2-core machine. Every test runs
    // (no fail-fast); the production rows ran above.
    let threads = std::env::var("RUST_TEST_THREADS").unwrap_or_else(|_| "24".into());
    let gates = Gates::start(&conform::workspace_root())?;
    let tested = step(
        "test",
        cargo()
            // The models run on their own below: their exploration takes every core.
            .args([
                "test",
                "--workspace",
                "--exclude",
                "dlock-model",
                "--no-fail-fast",
                "--",
            ])
            .args(prod::skip_args())
            .env("RUST_TEST_THREADS", threads)
            .env("DLOCK_REPORT_DIR", &report_dir),
    );
    eprintln!("\n==> conformance table (as cargo xtask conform prints it)");
    let root = conform::workspace_root();
    let judged = listing::Listing::ask_workspace(&root).and_then(|listing| {
        let (enrolled, not_enrolled): (Vec<conform::Backend>, Vec<conform::Backend>) =
            conform::BACKENDS.iter().partition(|b| listing.enrolled(b));
        let expected = listing.expected(&enrolled);
        conform::judge(
            &root,
            &report_dir,
            &enrolled,
            &not_enrolled,
            &expected,
            None,
            prod_ran.clone().err().into_iter().collect(),
        )
    });
    let _ = std::fs::remove_dir_all(&report_dir);
    let gated = gates.finish();
    tested?;
    prod_ran?;
    gated?;
    judged.map_err(|e| format!("step `conformance table` failed: {e}"))?;
    // Every protocol model at its quick bound (one at a time: each explores on every core);
    // the full bounds are `cargo xtask model`.
    step(
        "models (quick bounds)",
        cargo()
            .args(["test", "-p", "dlock-model"])
            .env("RUST_TEST_THREADS", "1"),
    )?;
    // A one-minute randomized fault soak: fails on any violation (promise, belief overlap,
    // token order, fenced safety). The 10-minute soak is `cargo xtask conform --soak 10m`.
    // The production rows' long leases make a one-minute soak say little: they soak with
    // `cargo xtask conform --soak 10m --backend zk-prod,etcd-prod`.
    let soaked: Vec<&str> = conform::BACKENDS
        .iter()
        .map(|b| b.name)
        .filter(|n| !conform::SUBSET_ROWS.contains(n))
        .collect();
    eprintln!(
        "\n==> soak smoke: conform --soak 1m --backend {}",
        soaked.join(",")
    );
    conform::run(&[
        "--soak".to_string(),
        "1m".to_string(),
        "--backend".to_string(),
        soaked.join(","),
    ])
    .map_err(|e| format!("step `soak smoke` failed: {e}"))?;
    // Proves the comparison harness end to end (no timing is asserted; figures land in
    // target/dlock-bench-quick for the curious).
    eprintln!("\n==> bench --quick");
    bench::run(&[
        "--quick".to_string(),
        "--out".to_string(),
        "target/dlock-bench-quick".to_string(),
    ])
    .map_err(|e| format!("step `bench --quick` failed: {e}"))?;
    eprintln!("\nxtask test: all steps passed");
    Ok(())
}
