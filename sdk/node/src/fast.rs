//! The generator's synchronous take (`tryNextId`) as a plain Node-API function, bound to one
//! generator: what a `nextIdSync()` or an already-settled `nextId()` costs, so it is written
//! against Node-API itself rather than through napi-rs's generated glue.
//!
//! Why: a napi-rs class method tracks its borrow of `this` in a process-wide map under a lock,
//! and every generated function opens and closes a borrow scope; measured here, a class method
//! returning the ID took about 345 ns a call and a free function of an `External` about 193 ns,
//! against 41 ns for `process.hrtime.bigint()`, the floor the package is held to. This function
//! takes no argument: the generator is the function's own data (a boxed `Arc`, dropped by the
//! function's finalizer when JavaScript lets go of it), so no value from JavaScript is ever
//! taken for a pointer.

use std::ffi::{CString, c_void};
use std::ptr;
use std::sync::Arc;

use napi::bindgen_prelude::{ToNapiValue, TypeName, ValueType};
use napi::sys;

/// A JavaScript function made here, returned to JavaScript as it is.
pub struct BoundFunction(sys::napi_value);

impl TypeName for BoundFunction {
    fn type_name() -> &'static str {
        "Function"
    }

    fn value_type() -> ValueType {
        ValueType::Function
    }
}

impl ToNapiValue for BoundFunction {
    unsafe fn to_napi_value(_env: sys::napi_env, value: Self) -> napi::Result<sys::napi_value> {
        Ok(value.0)
    }
}

fn status(code: sys::napi_status, what: &str) -> napi::Result<()> {
    if code == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::from_reason(format!("Node-API refused {what} ({code})")))
    }
}

/// A function `() => string | null` over `embedded`: one ID if the current millisecond has one
/// left, else `null`; an error (closed, forked) is thrown as the module's other errors are.
pub fn bind_try_next_id(env: sys::napi_env, embedded: Arc<idgen_sdk::Embedded>) -> napi::Result<BoundFunction> {
    let data = Box::into_raw(Box::new(embedded)).cast::<c_void>();
    let mut function = ptr::null_mut();
    let name = "tryNextId";
    // SAFETY: `env` is the calling environment; `data` stays valid until the finalizer below
    // runs, after which the function can no longer be called. Should either call fail, the
    // function is never handed to JavaScript and `data` is released here instead.
    unsafe {
        let made = status(
            sys::napi_create_function(
                env,
                name.as_ptr().cast(),
                name.len() as isize,
                Some(try_next_id),
                data,
                &mut function,
            ),
            "a function",
        )
        .and_then(|()| {
            let finalizer =
                sys::napi_add_finalizer(env, function, data, Some(release), ptr::null_mut(), ptr::null_mut());
            status(finalizer, "a finalizer")
        });
        if let Err(error) = made {
            release(env, data, ptr::null_mut());
            return Err(error);
        }
    }
    Ok(BoundFunction(function))
}

unsafe extern "C" fn release(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` is the box made in `bind_try_next_id`, released once, here.
    drop(unsafe { Box::from_raw(data.cast::<Arc<idgen_sdk::Embedded>>()) });
}

unsafe extern "C" fn try_next_id(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    let mut data = ptr::null_mut();
    let mut result = ptr::null_mut();
    // SAFETY: called by Node-API with its environment and this call's information; `data` is
    // the function's own, set in `bind_try_next_id` and alive while the function is.
    unsafe {
        let mut argc = 0usize;
        if sys::napi_get_cb_info(env, info, &mut argc, ptr::null_mut(), ptr::null_mut(), &mut data)
            != sys::Status::napi_ok
            || data.is_null()
        {
            return result;
        }
        let embedded = &*data.cast::<Arc<idgen_sdk::Embedded>>();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| embedded.try_next_id())) {
            Ok(Ok(Some(id))) => {
                let mut digits = itoa::Buffer::new();
                let text = digits.format(id);
                sys::napi_create_string_latin1(env, text.as_ptr().cast(), text.len() as isize, &mut result);
            }
            Ok(Ok(None)) => {
                sys::napi_get_null(env, &mut result);
            }
            Ok(Err(error)) => throw(env, crate::error_message(error)),
            Err(_) => throw(env, crate::error_message(idgen_sdk::Error::Failed("the generator panicked".into()))),
        }
    }
    result
}

unsafe fn throw(env: sys::napi_env, message: String) {
    let message = CString::new(message).unwrap_or_else(|_| c"an error with a NUL in its message".to_owned());
    // SAFETY: `env` is the calling environment; both strings outlive the call.
    unsafe {
        sys::napi_throw_error(env, ptr::null(), message.as_ptr());
    }
}
