//! After the end-to-end tests: does the chart grant the coordinator exactly
//! what it asked of the Kubernetes API during them? Reads the ground's API
//! server audit log and the chart's rules; exits 1 naming each difference.

use std::process::ExitCode;

use hv_tests::rbac;

fn main() -> ExitCode {
    let env = match hv_tests::env::load() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("hv-rbac-check: {e}");
            return ExitCode::from(2);
        }
    };
    let record = &env.kube.audit_log;
    let used = hv_tests::audit::read(record);
    if used.is_empty() {
        eprintln!("hv-rbac-check: nothing recorded in {} (did the end-to-end tests run?)", record.display());
        return ExitCode::from(2);
    }
    let rules = match rbac::read_rules(&rbac::chart_rules()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hv-rbac-check: {e}");
            return ExitCode::from(2);
        }
    };
    match rbac::check(&rules, &used, rbac::COORDINATOR_USER, rbac::COORDINATOR_NAMESPACE) {
        Ok(n) => {
            println!("RBAC: the chart grants the coordinator exactly the {n} permissions it used");
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("RBAC: the chart's coordinator rules differ from what it used ({}):", record.display());
            for p in problems {
                eprintln!("  {p}");
            }
            ExitCode::from(1)
        }
    }
}
