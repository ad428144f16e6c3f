//! hvctl's exit codes: distinct from clap's usage error (2), so that a
//! script can tell "you called me wrong" from "the host is not in service".

use std::process::ExitCode;

/// Shown under `hvctl --help`.
pub const HELP: &str = "Exit codes:
  0  done; for a question, yes (in service, SERVING, every VM can move)
  1  failed: the request could not be made, or was refused
  2  usage error: a flag or argument is wrong (clap's, or hvctl's own checks)
  3  the answer is no: `why` (not in service), `health` (not SERVING),
     `evict --dry-run` (some VM cannot move)
  4  waited in vain: `pause` not taken within 30 s, `evict --dry-run` no plan in time";

/// A flag or argument hvctl itself refuses (a reason missing or too long,
/// a termination not confirmed): a usage error, exit 2 as clap's own.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The exit code of an error: 2 for a [`Usage`] error, 1 for any other.
pub fn of_error(e: &anyhow::Error) -> ExitCode {
    match e.downcast_ref::<Usage>() {
        Some(_) => ExitCode::from(2),
        None => Outcome::Failed.code(),
    }
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Failed,
    No,
    TimedOut,
}

impl Outcome {
    pub const fn number(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::Failed => 1,
            Outcome::No => 3,
            Outcome::TimedOut => 4,
        }
    }

    pub fn code(self) -> ExitCode {
        ExitCode::from(self.number())
    }

    /// Done when `yes`, No otherwise.
    pub fn answer(yes: bool) -> Self {
        if yes { Outcome::Done } else { Outcome::No }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_outcome_shares_clap_usage_code_and_each_is_documented() {
        let all = [Outcome::Done, Outcome::Failed, Outcome::No, Outcome::TimedOut];
        let numbers: std::collections::BTreeSet<u8> = all.iter().map(|o| o.number()).collect();
        assert_eq!(numbers.len(), all.len());
        assert!(!numbers.contains(&2), "2 is clap's usage error");
        for n in numbers {
            assert!(HELP.contains(&format!("  {n}  ")), "{n} documented");
        }
    }
}
