//! librados's C API, loaded at run time (`dlopen("librados.so.2")`), so that zeta builds and
//! runs on a machine without Ceph and only a `rados:` device asks for it.
//!
//! Only the calls the device needs, with the prototypes of `rados/librados.h` (Ceph 16.2;
//! every one of them exists since Ceph 14).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

pub type Rados = *mut c_void;
pub type IoCtx = *mut c_void;
pub type Completion = *mut c_void;
pub type ListCtx = *mut c_void;
pub type WriteOp = *mut c_void;

/// `LIBRADOS_LOCK_FLAG_RENEW`: extend a lock this client and cookie already hold.
pub const LOCK_FLAG_RENEW: u8 = 1;
/// `LIBRADOS_CREATE_EXCLUSIVE`: fail with `EEXIST` if the object exists.
pub const CREATE_EXCLUSIVE: c_int = 1;

type Create = unsafe extern "C" fn(*mut Rados, *const c_char) -> c_int;
type ConfReadFile = unsafe extern "C" fn(Rados, *const c_char) -> c_int;
type ConfParseEnv = unsafe extern "C" fn(Rados, *const c_char) -> c_int;
type ConfSet = unsafe extern "C" fn(Rados, *const c_char, *const c_char) -> c_int;
type Connect = unsafe extern "C" fn(Rados) -> c_int;
type Shutdown = unsafe extern "C" fn(Rados);
type GetInstanceId = unsafe extern "C" fn(Rados) -> u64;
type PoolCreate = unsafe extern "C" fn(Rados, *const c_char) -> c_int;
type IoCtxCreate = unsafe extern "C" fn(Rados, *const c_char, *mut IoCtx) -> c_int;
type IoCtxDestroy = unsafe extern "C" fn(IoCtx);
type CreateCompletion2 = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut Completion) -> c_int;
type AioWrite =
    unsafe extern "C" fn(IoCtx, *const c_char, Completion, *const c_char, usize, u64) -> c_int;
type AioRead =
    unsafe extern "C" fn(IoCtx, *const c_char, Completion, *mut c_char, usize, u64) -> c_int;
type AioWait = unsafe extern "C" fn(Completion) -> c_int;
type AioReturn = unsafe extern "C" fn(Completion) -> c_int;
type AioRelease = unsafe extern "C" fn(Completion);
type AioRemove = unsafe extern "C" fn(IoCtx, *const c_char, Completion) -> c_int;
type Read = unsafe extern "C" fn(IoCtx, *const c_char, *mut c_char, usize, u64) -> c_int;
type Remove = unsafe extern "C" fn(IoCtx, *const c_char) -> c_int;
type GetXattr =
    unsafe extern "C" fn(IoCtx, *const c_char, *const c_char, *mut c_char, usize) -> c_int;
type CreateWriteOp = unsafe extern "C" fn() -> WriteOp;
type ReleaseWriteOp = unsafe extern "C" fn(WriteOp);
type WriteOpCreate = unsafe extern "C" fn(WriteOp, c_int, *const c_char);
type WriteOpSetXattr = unsafe extern "C" fn(WriteOp, *const c_char, *const c_char, usize);
type WriteOpOperate =
    unsafe extern "C" fn(WriteOp, IoCtx, *const c_char, *mut libc::time_t, c_int) -> c_int;
type LockExclusive = unsafe extern "C" fn(
    IoCtx,
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_char,
    *mut libc::timeval,
    u8,
) -> c_int;
type Unlock = unsafe extern "C" fn(IoCtx, *const c_char, *const c_char, *const c_char) -> c_int;
type ListLockers = unsafe extern "C" fn(
    IoCtx,
    *const c_char,
    *const c_char,
    *mut c_int,
    *mut c_char,
    *mut usize,
    *mut c_char,
    *mut usize,
    *mut c_char,
    *mut usize,
    *mut c_char,
    *mut usize,
) -> isize;
type BreakLock = unsafe extern "C" fn(
    IoCtx,
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_char,
) -> c_int;
type ListOpen = unsafe extern "C" fn(IoCtx, *mut ListCtx) -> c_int;
type ListNext = unsafe extern "C" fn(
    ListCtx,
    *mut *const c_char,
    *mut *const c_char,
    *mut *const c_char,
) -> c_int;
type ListClose = unsafe extern "C" fn(ListCtx);

/// The functions, and the library that keeps them mapped.
pub struct Api {
    pub create: Create,
    pub conf_read_file: ConfReadFile,
    pub conf_parse_env: ConfParseEnv,
    pub conf_set: ConfSet,
    pub connect: Connect,
    pub shutdown: Shutdown,
    pub get_instance_id: GetInstanceId,
    pub pool_create: PoolCreate,
    pub ioctx_create: IoCtxCreate,
    pub ioctx_destroy: IoCtxDestroy,
    pub aio_create_completion2: CreateCompletion2,
    pub aio_write: AioWrite,
    pub aio_read: AioRead,
    pub aio_wait_for_complete: AioWait,
    pub aio_get_return_value: AioReturn,
    pub aio_release: AioRelease,
    pub aio_remove: AioRemove,
    pub read: Read,
    pub remove: Remove,
    pub getxattr: GetXattr,
    pub create_write_op: CreateWriteOp,
    pub release_write_op: ReleaseWriteOp,
    pub write_op_create: WriteOpCreate,
    pub write_op_setxattr: WriteOpSetXattr,
    pub write_op_operate: WriteOpOperate,
    pub lock_exclusive: LockExclusive,
    pub unlock: Unlock,
    pub list_lockers: ListLockers,
    pub break_lock: BreakLock,
    pub nobjects_list_open: ListOpen,
    pub nobjects_list_next: ListNext,
    pub nobjects_list_close: ListClose,
    /// Keeps the functions above mapped; never dropped before them (it lives in a static).
    _lib: libloading::Library,
}

/// The library's file name: the soname Debian's `librados2` installs.
pub const LIBRARY: &str = "librados.so.2";

impl Api {
    fn load() -> Result<Api, String> {
        // SAFETY: librados's initialisers set up its own globals only; loading it has no
        // effect on this process beyond that.
        let lib = unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {
                // SAFETY: the type is the function's prototype in `rados/librados.h`; the
                // pointer is used only while `lib` (stored alongside, in a static) is loaded.
                *unsafe { lib.get::<$ty>($name) }.map_err(|e| e.to_string())?
            };
        }
        Ok(Api {
            create: sym!(b"rados_create", Create),
            conf_read_file: sym!(b"rados_conf_read_file", ConfReadFile),
            conf_parse_env: sym!(b"rados_conf_parse_env", ConfParseEnv),
            conf_set: sym!(b"rados_conf_set", ConfSet),
            connect: sym!(b"rados_connect", Connect),
            shutdown: sym!(b"rados_shutdown", Shutdown),
            get_instance_id: sym!(b"rados_get_instance_id", GetInstanceId),
            pool_create: sym!(b"rados_pool_create", PoolCreate),
            ioctx_create: sym!(b"rados_ioctx_create", IoCtxCreate),
            ioctx_destroy: sym!(b"rados_ioctx_destroy", IoCtxDestroy),
            aio_create_completion2: sym!(b"rados_aio_create_completion2", CreateCompletion2),
            aio_write: sym!(b"rados_aio_write", AioWrite),
            aio_read: sym!(b"rados_aio_read", AioRead),
            aio_wait_for_complete: sym!(b"rados_aio_wait_for_complete", AioWait),
            aio_get_return_value: sym!(b"rados_aio_get_return_value", AioReturn),
            aio_release: sym!(b"rados_aio_release", AioRelease),
            aio_remove: sym!(b"rados_aio_remove", AioRemove),
            read: sym!(b"rados_read", Read),
            remove: sym!(b"rados_remove", Remove),
            getxattr: sym!(b"rados_getxattr", GetXattr),
            create_write_op: sym!(b"rados_create_write_op", CreateWriteOp),
            release_write_op: sym!(b"rados_release_write_op", ReleaseWriteOp),
            write_op_create: sym!(b"rados_write_op_create", WriteOpCreate),
            write_op_setxattr: sym!(b"rados_write_op_setxattr", WriteOpSetXattr),
            write_op_operate: sym!(b"rados_write_op_operate", WriteOpOperate),
            lock_exclusive: sym!(b"rados_lock_exclusive", LockExclusive),
            unlock: sym!(b"rados_unlock", Unlock),
            list_lockers: sym!(b"rados_list_lockers", ListLockers),
            break_lock: sym!(b"rados_break_lock", BreakLock),
            nobjects_list_open: sym!(b"rados_nobjects_list_open", ListOpen),
            nobjects_list_next: sym!(b"rados_nobjects_list_next", ListNext),
            nobjects_list_close: sym!(b"rados_nobjects_list_close", ListClose),
            _lib: lib,
        })
    }
}

/// librados, loaded on first use; the same error every later time if it is not there.
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(Api::load).as_ref().map_err(Clone::clone)
}
