//! Ceph RBD reachability, as the node's own restricted Ceph client: the
//! librados/librbd FFI, used only by the `hv-ceph-probe` binary.
//!
//! Why our own FFI rather than the `ceph` crate: that crate connects in one
//! call with no way to set the client's keyring or the timeouts first (an
//! unreachable monitor would block for `client_mount_timeout`, 300 s by
//! default), and it brings a large dependency tree. Nine librados and
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
//! by the count librbd asked for).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
                    })
                    .collect();
            }
        };
        pools
            .iter()
            .map(|pool| {
                let t = Instant::now();
                let (passed, message) = match check_pool(&cluster, pool, &self.id) {
                    Ok(m) => (true, m),
                    Err(m) => (false, m),
                };
                PoolCheck { pool: pool.clone(), passed, message, latency: t.elapsed() }
            })
            .collect()
    }
}

fn check_pool(cluster: &Cluster, pool: &str, id: &str) -> Result<String, String> {
    let name = cstr(pool)?;
    let mut io: rados_ioctx_t = std::ptr::null_mut();
    // SAFETY: valid cluster, C string, out-parameter.
    let rc = unsafe { rados_ioctx_create(cluster.0, name.as_ptr(), &mut io) };
    if rc < 0 {
        return Err(format!("pool {pool}: {}", errno(rc)));
    }
    let io = IoCtx(io, std::marker::PhantomData);
    let images =
        list_images(&io).map_err(|e| format!("client.{id} cannot list RBD images in pool {pool}: {e}"))?;
    let Some(first) = images.first() else {
        return Ok(format!("pool {pool} readable, no RBD image in it"));
    };
    let cname = cstr(first)?;
    let mut img: rbd_image_t = std::ptr::null_mut();
    // SAFETY: valid io context, C strings (null snapshot = head), out-parameter.
    let rc = unsafe { rbd_open_read_only(io.0, cname.as_ptr(), &mut img, std::ptr::null()) };
    if rc < 0 {
        return Err(format!("opening {pool}/{first} read-only: {}", errno(rc)));
    }
    let img = Image(img, std::marker::PhantomData);
    // SAFETY: zeroed POD out-buffer of the size we pass.
    let mut info: RbdImageInfo = unsafe { std::mem::zeroed() };
    // SAFETY: valid image, buffer of `size_of::<RbdImageInfo>()` bytes.
    let rc = unsafe { rbd_stat(img.0, &mut info, std::mem::size_of::<RbdImageInfo>()) };
    if rc < 0 {
        return Err(format!("stat {pool}/{first}: {}", errno(rc)));
    }
    Ok(format!("pool {pool}: {} RBD image(s); {pool}/{first} is {} MiB", images.len(), info.size >> 20))
}

fn list_images(io: &IoCtx<'_>) -> Result<Vec<String>, String> {
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
            return Err(errno(rc));
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
