//! Shared libraries opened at run time (`dlopen`), for the login methods that call a
//! system library (PAM, LDAP): Sluice builds without their headers, and runs where
//! they are missing as long as no configuration asks for them.

use std::ffi::{c_void, CStr};

/// An opened library. Never closed: function pointers taken from it stay valid for
/// the life of the process.
pub(super) struct Library {
    handle: *mut c_void,
    name: String,
}

// SAFETY: a dlopen handle is a process-wide token that dlsym accepts from any
// thread; `Library` only ever passes it to dlsym.
unsafe impl Send for Library {}
// SAFETY: as above; nothing is mutated through it.
unsafe impl Sync for Library {}

impl Library {
    /// Opens the first of `names` that loads.
    pub(super) fn open(names: &[&CStr]) -> Result<Library, String> {
        for name in names {
            // SAFETY: dlopen takes a NUL-terminated name and returns a handle or NULL.
            let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                let name = name.to_string_lossy().into_owned();
                return Ok(Library { handle, name });
            }
        }
        let tried: Vec<_> = names.iter().map(|n| n.to_string_lossy()).collect();
        Err(format!("{} could not be loaded", tried.join(" or ")))
    }

    /// The function `symbol`, as the function pointer type `F`.
    ///
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn` type whose arguments and result are the
    /// C prototype of the library's function of that name.
    pub(super) unsafe fn function<F: Copy>(&self, symbol: &CStr) -> Result<F, String> {
        let p = self.sym(symbol)?;
        if std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
            return Err(format!(
                "{} is not a function pointer type",
                std::any::type_name::<F>()
            ));
        }
        // SAFETY: `F` is a function pointer type of that function's prototype (the
        // caller's promise) and of a data pointer's size (checked); dlsym hands
        // functions out as data pointers, which POSIX requires to convert back.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    /// The address of `symbol`.
    fn sym(&self, symbol: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: `handle` is a live dlopen handle and `symbol` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, symbol.as_ptr()) };
        if p.is_null() {
            Err(format!("{} has no {}", self.name, symbol.to_string_lossy()))
        } else {
            Ok(p)
        }
    }
}
