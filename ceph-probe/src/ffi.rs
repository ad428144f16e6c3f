//! Ceph RBD reachability, as the node's own restricted Ceph client: the
//! librados/librbd FFI, used only by the `hv-ceph-probe` binary.
//!
//! Why our own FFI rather than the `ceph` crate: that crate connects in one
//! call with no way to set the client's keyring or the timeouts first (an
//! unreachable monitor would block for `client_mount_timeout`, 300 s by
//! default), and it brings a large dependency tree. A dozen librados and
//! librbd functions are less code than working around it. No RBD crate
//! fits bookworm's librbd 1.16.
//!
//! Safety argument: every handle (`rados_t`, `rados_ioctx_t`,
//! `rbd_image_t`) is owned by exactly one RAII wrapper that releases it once
//! in `Drop`, and only after the wrapper of the handle it depends on (an
//! io context lives inside its cluster's scope, an image inside its io
//! context's). Strings passed in are `CString`s that outlive the call;
//! strings read back (`rbd_list2`'s names) are copied before
//! `rbd_image_spec_list_cleanup` frees them. Buffers passed for output are
//! sized as the C API requires (`rbd_image_info_t` by value, the spec array
//! by the count librbd asked for). Buffers librados allocates
//! (`rados_getaddrs`' string, `rados_mon_command`'s output and status) are
//! copied, then released with `rados_buffer_free` exactly once.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::blocklist;

#[allow(non_camel_case_types)]
type rados_t = *mut c_void;
#[allow(non_camel_case_types)]
type rados_ioctx_t = *mut c_void;
#[allow(non_camel_case_types)]
type rbd_image_t = *mut c_void;

#[repr(C)]
struct RbdImageSpec {
    id: *mut c_char,
    name: *mut c_char,
}

#[repr(C)]
struct RbdImageInfo {
    size: u64,
    obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; 24],
    parent_pool: i64,
    parent_name: [c_char; 96],
}

#[link(name = "rados")]
unsafe extern "C" {
    fn rados_create(cluster: *mut rados_t, id: *const c_char) -> c_int;
    fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
    fn rados_conf_set(cluster: rados_t, option: *const c_char, value: *const c_char) -> c_int;
    fn rados_connect(cluster: rados_t) -> c_int;
    fn rados_shutdown(cluster: rados_t);
    fn rados_ioctx_create(cluster: rados_t, pool: *const c_char, io: *mut rados_ioctx_t) -> c_int;
    fn rados_ioctx_destroy(io: rados_ioctx_t);
    fn rados_getaddrs(cluster: rados_t, addrs: *mut *mut c_char) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn rados_mon_command(
        cluster: rados_t,
        cmd: *const *const c_char,
        cmdlen: usize,
        inbuf: *const c_char,
        inbuflen: usize,
        outbuf: *mut *mut c_char,
        outbuflen: *mut usize,
        outs: *mut *mut c_char,
        outslen: *mut usize,
    ) -> c_int;
    fn rados_buffer_free(buf: *mut c_char);
}

#[link(name = "rbd")]
unsafe extern "C" {
    fn rbd_list2(io: rados_ioctx_t, images: *mut RbdImageSpec, max: *mut usize) -> c_int;
    fn rbd_image_spec_list_cleanup(images: *mut RbdImageSpec, num: usize);
    fn rbd_open_read_only(
        io: rados_ioctx_t,
        name: *const c_char,
        image: *mut rbd_image_t,
        snap: *const c_char,
    ) -> c_int;
    fn rbd_stat(image: rbd_image_t, info: *mut RbdImageInfo, infosize: usize) -> c_int;
    fn rbd_close(image: rbd_image_t) -> c_int;
}

/// How the node reaches Ceph.
#[derive(Clone, Debug)]
pub struct CephClient {
    pub conf: PathBuf,
    /// Client id without the `client.` prefix.
    pub id: String,
    /// The client's keyring; the conf's default search path when None.
    pub keyring: Option<PathBuf>,
    pub timeout: Duration,
}

/// The result of checking one pool.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PoolCheck {
    pub pool: String,
    pub passed: bool,
    pub message: String,
    pub latency: Duration,
    /// The OSDs refused this client as blocklisted (ESHUTDOWN).
    pub blocklisted: bool,
    /// The IPs this client reached the cluster from, as the cluster told
    /// it (empty when it never connected): what fencing blocklists.
    pub client_ips: Vec<String>,
}

fn errno(rc: c_int) -> String {
    std::io::Error::from_raw_os_error(-rc).to_string()
}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

struct Cluster(rados_t);

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: created by rados_create, shut down once.
        unsafe { rados_shutdown(self.0) }
    }
}

struct IoCtx<'c>(rados_ioctx_t, std::marker::PhantomData<&'c Cluster>);

impl Drop for IoCtx<'_> {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create, destroyed once, before its cluster.
        unsafe { rados_ioctx_destroy(self.0) }
    }
}

struct Image<'i>(rbd_image_t, std::marker::PhantomData<&'i IoCtx<'i>>);

impl Drop for Image<'_> {
    fn drop(&mut self) {
        // SAFETY: opened by rbd_open_read_only, closed once, before its io context.
        unsafe {
            rbd_close(self.0);
        }
    }
}

impl CephClient {
    fn connect(&self) -> Result<Cluster, String> {
        let id = cstr(&self.id)?;
        let mut h: rados_t = std::ptr::null_mut();
        // SAFETY: `h` is an out-parameter; `id` outlives the call.
        let rc = unsafe { rados_create(&mut h, id.as_ptr()) };
        if rc < 0 {
            return Err(format!("rados_create: {}", errno(rc)));
        }
        let cluster = Cluster(h);
        let conf = cstr(&self.conf.to_string_lossy())?;
        // SAFETY: valid handle and C string.
        let rc = unsafe { rados_conf_read_file(cluster.0, conf.as_ptr()) };
        if rc < 0 {
            return Err(format!("reading {}: {}", self.conf.display(), errno(rc)));
        }
        let secs = self.timeout.as_secs().max(1).to_string();
        let mut opts = vec![
            ("client_mount_timeout", secs.clone()),
            ("rados_mon_op_timeout", secs.clone()),
            ("rados_osd_op_timeout", secs),
        ];
        if let Some(k) = &self.keyring {
            opts.push(("keyring", k.to_string_lossy().into_owned()));
        }
        for (k, v) in opts {
            let (ck, cv) = (cstr(k)?, cstr(&v)?);
            // SAFETY: valid handle and C strings.
            let rc = unsafe { rados_conf_set(cluster.0, ck.as_ptr(), cv.as_ptr()) };
            if rc < 0 {
                return Err(format!("setting {k}: {}", errno(rc)));
            }
        }
        // SAFETY: configured handle.
        let rc = unsafe { rados_connect(cluster.0) };
        if rc < 0 {
            return Err(format!("connecting to Ceph as client.{}: {}", self.id, errno(rc)));
        }
        Ok(cluster)
    }

    /// Check each pool: open it, list its RBD images, stat the first.
    /// Blocking (run it in `spawn_blocking`).
    pub fn check_pools(&self, pools: &[String]) -> Vec<PoolCheck> {
        let start = Instant::now();
        let cluster = match self.connect() {
            Ok(c) => c,
            Err(e) => {
                return pools
                    .iter()
                    .map(|p| PoolCheck {
                        pool: p.clone(),
                        passed: false,
                        message: e.clone(),
                        latency: start.elapsed(),
                        blocklisted: false,
                        client_ips: Vec::new(),
                    })
                    .collect();
            }
        };
        let mut checks: Vec<PoolCheck> = pools
            .iter()
            .map(|pool| {
                let t = Instant::now();
                let (passed, message, blocklisted) = match check_pool(&cluster, pool, &self.id) {
                    Ok(m) => (true, m, false),
                    Err(f) if f.rc == -ESHUTDOWN => (false, self.blocklisted(&cluster, &f.message), true),
                    Err(f) => (false, f.message, false),
                };
                let latency = t.elapsed();
                PoolCheck {
                    pool: pool.clone(),
                    passed,
                    message,
                    latency,
                    blocklisted,
                    client_ips: Vec::new(),
                }
            })
            .collect();
        // Known once the monitors answered: the address they saw, not one
        // the host thinks it has (NAT, several interfaces).
        let ips = own_addrs(&cluster).map(|own| client_ips(&own)).unwrap_or_default();
        for c in &mut checks {
            c.client_ips = ips.clone();
        }
        checks
    }

    /// Adds (`add`) or lifts each of `entries` in the OSD blocklist, then
    /// reads the blocklist back from the OSD map: which of `entries` are
    /// listed now. An added entry lasts `expire`. Blocking.
    pub fn blocklist(&self, add: bool, entries: &[String], expire: Duration) -> Result<Vec<String>, String> {
        let cluster = self.connect()?;
        for entry in entries {
            let cmd = if add {
                serde_json::json!({"prefix": "osd blocklist", "blocklistop": "add", "addr": entry,
                                   "expire": expire.as_secs_f64()})
            } else {
                serde_json::json!({"prefix": "osd blocklist", "blocklistop": "rm", "addr": entry})
            };
            let op = if add { "add" } else { "rm" };
            mon_command(&cluster, &cmd.to_string(), &format!("osd blocklist {op} {entry}"))?;
        }
        let dump = mon_command(&cluster, r#"{"prefix": "osd dump", "format": "json"}"#, "osd dump")?;
        let map: serde_json::Value =
            serde_json::from_slice(&dump).map_err(|e| format!("osd dump is not JSON: {e}"))?;
        let listed = blocklist::entries(&map);
        Ok(entries.iter().filter(|e| listed.iter().any(|l| blocklist::same_entry(l, e))).cloned().collect())
    }

    /// What to say of a client the OSDs refused with ESHUTDOWN: the
    /// blocklist entry that covers it, read from the OSD map (the mon's
    /// `profile rbd` may read it) only then. The message names the client's
    /// IP, not its per-process address, so it stays the same from one
    /// probe to the next.
    fn blocklisted(&self, cluster: &Cluster, refused: &str) -> String {
        let entry = own_addrs(cluster).and_then(|own| {
            let addrs = blocklist::Addr::parse_vec(&own);
            let ip = addrs.first().map(|a| a.ip.to_string()).ok_or(format!("unreadable address {own:?}"))?;
            let dump = mon_command(cluster, r#"{"prefix": "osd dump", "format": "json"}"#, "osd dump")?;
            let map: serde_json::Value =
                serde_json::from_slice(&dump).map_err(|e| format!("osd dump is not JSON: {e}"))?;
            Ok(match blocklist::listed(&addrs, &map) {
                Some(entry) => format!("at {ip}, entry {entry}"),
                None => format!("at {ip}, no entry found in the OSD map"),
            })
        });
        let entry = entry.unwrap_or_else(|e| format!("the blocklist was not readable: {e}"));
        format!(
            "client.{} is blocklisted by the cluster ({entry}): it can no longer read or write its images ({refused})",
            self.id
        )
    }
}

/// The distinct IPs of a client address vector (`v2:IP:port/nonce` or
/// `[a,b]`), unspecified ones (a client that has not learned its address)
/// left out. Pure.
fn client_ips(addrs: &str) -> Vec<String> {
    let mut ips: Vec<String> = blocklist::Addr::parse_vec(addrs)
        .into_iter()
        .filter(|a| !a.ip.is_unspecified())
        .map(|a| a.ip.to_string())
        .collect();
    ips.dedup();
    ips
}

/// This client's addresses, as `v2:IP:port/nonce` or `[a,b]`.
fn own_addrs(cluster: &Cluster) -> Result<String, String> {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: connected cluster, out-parameter.
    let rc = unsafe { rados_getaddrs(cluster.0, &mut out) };
    if rc < 0 || out.is_null() {
        return Err(if rc < 0 {
            format!("rados_getaddrs: {}", errno(rc))
        } else {
            "rados_getaddrs: no address".into()
        });
    }
    // SAFETY: librados wrote a NUL-terminated string; copied, then freed once.
    let addrs = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
    // SAFETY: allocated by librados, released once.
    unsafe { rados_buffer_free(out) };
    Ok(addrs)
}

/// A monitor command's output; an error names it as `what`.
fn mon_command(cluster: &Cluster, cmd: &str, what: &str) -> Result<Vec<u8>, String> {
    let c = cstr(cmd)?;
    let cmds = [c.as_ptr()];
    let (mut out, mut out_len): (*mut c_char, usize) = (std::ptr::null_mut(), 0);
    let (mut status, mut status_len): (*mut c_char, usize) = (std::ptr::null_mut(), 0);
    // SAFETY: one valid C string in `cmds`; no input buffer; out-parameters.
    let rc = unsafe {
        rados_mon_command(
            cluster.0,
            cmds.as_ptr(),
            1,
            std::ptr::null(),
            0,
            &mut out,
            &mut out_len,
            &mut status,
            &mut status_len,
        )
    };
    let copy = |p: *mut c_char, len: usize| -> Vec<u8> {
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: librados gave `len` bytes at `p`; copied, then freed once.
        let v = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec();
        // SAFETY: allocated by librados, released once.
        unsafe { rados_buffer_free(p) };
        v
    };
    let (out, status) = (copy(out, out_len), copy(status, status_len));
    if rc < 0 {
        return Err(format!("{what}: {} ({})", errno(rc), String::from_utf8_lossy(&status).trim()));
    }
    Ok(out)
}

/// A librados/librbd call that failed: what was being done, and its code.
struct Failure {
    message: String,
    rc: c_int,
}

/// Errno of "Cannot send after transport endpoint shutdown": the OSDs'
/// answer to a blocklisted client (EBLOCKLISTED).
const ESHUTDOWN: c_int = 108;

fn check_pool(cluster: &Cluster, pool: &str, id: &str) -> Result<String, Failure> {
    let fail = |rc: c_int, what: String| Failure { message: format!("{what}: {}", errno(rc)), rc };
    let plain = |message: String| Failure { message, rc: 0 };
    let name = cstr(pool).map_err(plain)?;
    let mut io: rados_ioctx_t = std::ptr::null_mut();
    // SAFETY: valid cluster, C string, out-parameter.
    let rc = unsafe { rados_ioctx_create(cluster.0, name.as_ptr(), &mut io) };
    if rc < 0 {
        return Err(fail(rc, format!("pool {pool}")));
    }
    let io = IoCtx(io, std::marker::PhantomData);
    let images = list_images(&io)
        .map_err(|rc| fail(rc, format!("client.{id} cannot list RBD images in pool {pool}")))?;
    let Some(first) = images.first() else {
        return Ok(format!("pool {pool} readable, no RBD image in it"));
    };
    let cname = cstr(first).map_err(plain)?;
    let mut img: rbd_image_t = std::ptr::null_mut();
    // SAFETY: valid io context, C strings (null snapshot = head), out-parameter.
    let rc = unsafe { rbd_open_read_only(io.0, cname.as_ptr(), &mut img, std::ptr::null()) };
    if rc < 0 {
        return Err(fail(rc, format!("opening {pool}/{first} read-only")));
    }
    let img = Image(img, std::marker::PhantomData);
    // SAFETY: zeroed POD out-buffer of the size we pass.
    let mut info: RbdImageInfo = unsafe { std::mem::zeroed() };
    // SAFETY: valid image, buffer of `size_of::<RbdImageInfo>()` bytes.
    let rc = unsafe { rbd_stat(img.0, &mut info, std::mem::size_of::<RbdImageInfo>()) };
    if rc < 0 {
        return Err(fail(rc, format!("stat {pool}/{first}")));
    }
    Ok(format!("pool {pool}: {} RBD image(s); {pool}/{first} is {} MiB", images.len(), info.size >> 20))
}

/// The images' names, or the failed call's code.
fn list_images(io: &IoCtx<'_>) -> Result<Vec<String>, c_int> {
    let mut max: usize = 16;
    loop {
        // SAFETY: zeroed array of `max` specs; librbd fills at most `max`.
        let mut specs: Vec<RbdImageSpec> =
            (0..max).map(|_| RbdImageSpec { id: std::ptr::null_mut(), name: std::ptr::null_mut() }).collect();
        // SAFETY: `specs` has `max` elements; `max` is updated to the count.
        let rc = unsafe { rbd_list2(io.0, specs.as_mut_ptr(), &mut max) };
        if rc == -(libc_erange()) {
            continue; // `max` now holds the size needed
        }
        if rc < 0 {
            return Err(rc);
        }
        let mut names = Vec::with_capacity(max);
        for s in specs.iter().take(max) {
            if !s.name.is_null() {
                // SAFETY: librbd wrote NUL-terminated names; copied before cleanup.
                names.push(unsafe { CStr::from_ptr(s.name) }.to_string_lossy().into_owned());
            }
        }
        // SAFETY: frees exactly the `max` specs librbd filled.
        unsafe { rbd_image_spec_list_cleanup(specs.as_mut_ptr(), max) };
        names.sort();
        return Ok(names);
    }
}

const fn libc_erange() -> c_int {
    34
}

#[cfg(test)]
mod tests {
    use super::client_ips;

    #[test]
    fn a_clients_ips_are_read_from_its_address_vector_once_each() {
        assert_eq!(client_ips("v2:10.0.0.7:0/123"), ["10.0.0.7"]);
        assert_eq!(client_ips("[v2:10.0.0.7:0/1,v1:10.0.0.7:0/1]"), ["10.0.0.7"]);
        assert_eq!(client_ips("[v2:10.0.0.7:0/1,v2:[fd00::7]:0/1]"), ["10.0.0.7", "fd00::7"]);
        // Not learned yet: nothing to fence.
        assert!(client_ips("v2:0.0.0.0:0/123").is_empty());
        assert!(client_ips("garbage").is_empty());
    }
}
