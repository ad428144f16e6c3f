use super::*;

fn vm(id: &str, ram_mb: u64) -> Server {
    crate::eviction::preflight::tests::vm(id, 1, ram_mb)
}

fn host(name: &str, ram_mb: u64, asleep: bool) -> Candidate {
    Candidate { asleep, ..crate::eviction::preflight::tests::host(name, 64, ram_mb) }
}

fn wake(servers: &[Server], candidates: &[Candidate]) -> Option<Vec<String>> {
    hosts_to_wake(servers, MigrationPolicy::LiveMigrate, candidates, &[])
}

#[test]
fn the_smallest_single_hibernated_host_that_suffices_is_woken() {
    let servers = [vm("a", 4096)];
    let hosts = [host("awake", 1024, false), host("big", 65_536, true), host("fit", 8192, true)];
    assert_eq!(wake(&servers, &hosts), Some(vec!["fit".to_string()]));
}

#[test]
fn when_no_single_host_suffices_the_ones_the_vms_fit_on_are_woken() {
    let servers = [vm("a", 6144), vm("b", 6144)];
    let hosts = [host("h1", 8192, true), host("h2", 8192, true), host("h3", 1024, true)];
    assert_eq!(wake(&servers, &hosts), Some(vec!["h1".to_string(), "h2".to_string()]));
}

#[test]
fn hosts_that_would_not_let_every_vm_go_are_not_worth_a_wake() {
    // Too small, even all together.
    let servers = [vm("a", 16_384)];
    assert_eq!(wake(&servers, &[host("h1", 8192, true), host("h2", 8192, true)]), None);
    // Outside the zone the VM is pinned to.
    let mut pinned = vm("b", 1024);
    pinned.needs.pinned_az = Some("az-2".into());
    assert_eq!(wake(&[pinned], &[host("h1", 8192, true)]), None);
    // A VM no room settles (locked): none.
    let locked = Server { locked: true, ..vm("c", 1024) };
    assert_eq!(wake(&[locked], &[host("h1", 8192, true)]), None);
    // Nothing asleep: nothing to wake.
    assert_eq!(wake(&[vm("d", 16_384)], &[host("awake", 1024, false)]), None);
}

#[test]
fn the_awake_hosts_room_counts_first() {
    // One VM fits awake, the other needs a host woken: the smaller that takes it.
    let servers = [vm("a", 4096), vm("b", 4096)];
    let hosts = [host("awake", 4096, false), host("s-small", 4096, true), host("s-big", 32_768, true)];
    assert_eq!(wake(&servers, &hosts), Some(vec!["s-small".to_string()]));
}
