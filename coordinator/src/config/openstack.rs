//! The OpenStack flags: where the credentials come from, and how hard Nova,
//! Placement and Keystone may be pressed.

use std::path::PathBuf;
use std::time::Duration;

use super::duration;

use crate::nova::CloudSource;

#[derive(clap::Args, Debug)]
pub struct OpenStackFlags {
    /// Cloud name in clouds.yaml; without it the OS_* variables are used.
    #[arg(long, env = "OS_CLOUD")]
    pub os_cloud: Option<String>,
    /// clouds.yaml to read (default: ./clouds.yaml, ~/.config/openstack/, /etc/openstack/).
    #[arg(long, env = "OS_CLIENT_CONFIG_FILE")]
    pub clouds_yaml: Option<PathBuf>,
    /// Requests to Nova, Placement and Keystone in flight at once; more wait
    /// their turn. A struggling Nova is not sent a retry storm by thousands
    /// of reconciles (docs/nova.md).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub openstack_max_in_flight: u32,
    /// Longest wait for the answer to one request to Nova, Placement or
    /// Keystone. A read of the whole fleet asks for a thousand hypervisors
    /// with their servers in one page; a Nova that takes longer for it
    /// needs more (docs/nova.md).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub openstack_timeout: Duration,
}

impl OpenStackFlags {
    /// Where the credentials are read: a cloud from clouds.yaml, else the
    /// OS_* variables.
    pub fn source(&self) -> CloudSource {
        match &self.os_cloud {
            Some(cloud) => CloudSource::CloudsYaml { cloud: cloud.clone(), file: self.clouds_yaml.clone() },
            None => CloudSource::Env,
        }
    }
}
