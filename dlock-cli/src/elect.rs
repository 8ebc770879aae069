//! `dlock elect` (run a command while leading an election) and `dlock leader` (who leads).

use std::process::ExitCode;
use std::sync::Arc;

use dlock_core::{AcquireOptions, Election, Error, LockName, Locker};
use serde_json::json;

use crate::exit::{self, Failure};
use crate::run::{Held, Job, Signals, or_signal, supervise};
use crate::target::{Source, Target};
use crate::{ElectArgs, LeaderArgs, lock_name, runtime};

/// Runs `dlock elect`; `Ok` carries the command's exit code.
pub(crate) fn main(source: &Source, args: ElectArgs) -> Result<ExitCode, Failure> {
    let target = source.target(args.run.ttl)?;
    let name = lock_name(&args.run.name)?;
    target.route(&name)?;
    let shown = target.shown();
    let rt = runtime()?;
    rt.block_on(elect(target, &name, args))
        .map_err(|f| f.with("name", name.as_str()).with("url", shown))
}

async fn elect(target: Target, name: &LockName, args: ElectArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::new()?;
    let election = match or_signal(&mut signals, async {
        let locker = target
            .connect()
            .await
            .map_err(|e| Failure::from_error(&e))?;
        election_of(locker).map_err(|e| Failure::from_error(&e))
    })
    .await?
    {
        Ok(e) => e,
        Err(code) => return Ok(code),
    };
    let opts = args
        .run
        .wait
        .map_or_else(AcquireOptions::forever, AcquireOptions::wait);
    let campaign = async {
        election
            .campaign(name, args.value.as_bytes(), opts)
            .await
            .map_err(|e| {
                let f = Failure::from_error(&e);
                if f.code == exit::TIMEOUT {
                    Failure::new("timeout", exit::TIMEOUT, format!("election {name}: {e}"))
                } else {
                    f
                }
            })
    };
    let leadership = match or_signal(&mut signals, campaign).await? {
        Ok(l) => l,
        Err(code) => {
            // Closing waits for the withdrawal of the dropped campaign's queue entry.
            let _ = election.close().await;
            return Ok(code);
        }
    };
    let job = Job {
        command: &args.run.command,
        grace: args.run.grace,
    };
    let done = supervise(Held::Leader(leadership), name, &job, &mut signals).await;
    // As `run`: the session ends (and a tiered configuration's drift guard) when this exits.
    let _ = election.close().await;
    done
}

/// Runs `dlock leader`: prints the leader's term and value and exits 0, or says nobody leads
/// and exits with [`exit::NO_LEADER`].
pub(crate) fn leader(source: &Source, args: LeaderArgs, json: bool) -> Result<ExitCode, Failure> {
    let target = source.target(None)?;
    let name = lock_name(&args.name)?;
    // Only reads: under a configuration, the name's tier alone (no drift guard taken).
    let url = target.route(&name)?.url;
    let shown = target.shown();
    let rt = runtime()?;
    let found = rt
        .block_on(async {
            let election = election_of(url.connect().await?)?;
            let found = election.leader(&name).await;
            let _ = election.close().await;
            found
        })
        .map_err(|e| {
            Failure::from_error(&e)
                .with("name", name.as_str())
                .with("url", shown.clone())
        })?;
    let Some(leader) = found else {
        if json {
            println!("{}", json!({ "name": name.as_str(), "leader": null }));
        } else {
            println!("election {name}: nobody leads");
        }
        return Ok(ExitCode::from(exit::NO_LEADER));
    };
    let value = String::from_utf8_lossy(&leader.value);
    if json {
        println!(
            "{}",
            json!({
                "name": name.as_str(),
                "leader": { "term": leader.term.get(), "value": value },
            })
        );
    } else {
        println!("election {name}: term {} value {value}", leader.term);
    }
    Ok(ExitCode::SUCCESS)
}

/// `locker` as an election.
///
/// # Errors
/// [`Error::InvalidOption`] (`url.scheme`) for a locker that offers only the mutex
/// (`redlock://`, or a tiered configuration with such a tier).
fn election_of(locker: Arc<dyn Locker>) -> Result<Arc<dyn Election>, Error> {
    locker.into_election().ok_or_else(|| {
        Error::invalid_option(
            "url.scheme",
            "this locker offers only the mutex, not elections (redlock://)",
        )
    })
}
