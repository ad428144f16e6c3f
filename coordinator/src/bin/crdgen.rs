//! Writes the CRD YAML of `hv_coordinator::api` into a directory
//! (`make crds` -> `deploy/crds/`). Nothing else writes those files.

use std::path::PathBuf;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "deploy/crds".into()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for crd in hv_coordinator::api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let path = dir.join(format!("{name}.yaml"));
        let yaml = hv_coordinator::api::crd_yaml(&crd)?;
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
