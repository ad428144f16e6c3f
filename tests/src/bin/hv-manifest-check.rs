//! `make chart-check`, second half: every object the chart rendered (the
//! directories given) against the Kubernetes API types (`hv_tests::manifests`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut checked = 0;
    let mut failed = Vec::new();
    for dir in std::env::args().skip(1) {
        let mut files: Vec<_> = walk(std::path::Path::new(&dir));
        files.sort();
        for file in files {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    failed.push(format!("{}: {e}", file.display()));
                    continue;
                }
            };
            match hv_tests::manifests::objects(&text) {
                Ok(objs) => {
                    for o in objs {
                        checked += 1;
                        if let Err(e) = hv_tests::manifests::check(&o) {
                            failed.push(format!("{}: {e}", file.display()));
                        }
                    }
                }
                Err(e) => failed.push(format!("{}: not YAML: {e}", file.display())),
            }
        }
    }
    if checked == 0 {
        eprintln!("hv-manifest-check: no object found");
        return ExitCode::from(2);
    }
    if failed.is_empty() {
        println!("{checked} rendered objects match the Kubernetes API types");
        ExitCode::SUCCESS
    } else {
        for f in &failed {
            eprintln!("{f}");
        }
        ExitCode::from(1)
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p)
            } else if p.extension().is_some_and(|x| x == "yaml") {
                vec![p]
            } else {
                vec![]
            }
        })
        .collect()
}
