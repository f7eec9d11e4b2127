//! ferry's module ABI: the import module name, every import with its signature, the
//! exports, the status codes. `docs/MODULES.md` is the prose version of this file.

use wasmtime::{ExternType, Module, ValType};

use crate::Error;

/// The wasm module name every import must come from.
pub const IMPORT_MODULE: &str = "ferry";

/// Export: the module's linear memory (required).
pub const EXPORT_MEMORY: &str = "memory";
/// Export: `init() -> i32`, called once at start (required).
pub const EXPORT_INIT: &str = "init";
/// Export: `on_data(buf: i32) -> i32`, called for each buffer fed (required).
pub const EXPORT_ON_DATA: &str = "on_data";
/// Export: `on_close() -> i32`, called at the end of the input (optional).
pub const EXPORT_ON_CLOSE: &str = "on_close";

/// Callback status: carry on.
pub const STATUS_CONTINUE: i32 = 0;
/// Callback status: the module is finished; it wants no more input.
pub const STATUS_FINISHED: i32 = 1;

/// Host call result: the property or file does not exist.
pub const ERR_ABSENT: i32 = -1;
/// Host call result: not a live buffer handle (or not a file index).
pub const ERR_BADF: i32 = -2;
/// Host call result: offset or length outside the buffer or file.
pub const ERR_RANGE: i32 = -3;
/// Host call result: an argument is invalid (negative length, ...).
pub const ERR_INVAL: i32 = -4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    I32,
    I64,
}

/// `(name, params, results)` of every import the host offers.
pub(crate) const IMPORTS: &[(&str, &[Ty], &[Ty])] = &[
    ("buf_len", &[Ty::I32], &[Ty::I32]),
    (
        "buf_read",
        &[Ty::I32, Ty::I32, Ty::I32, Ty::I32],
        &[Ty::I32],
    ),
    ("buf_new", &[Ty::I32, Ty::I32], &[Ty::I32]),
    (
        "buf_write",
        &[Ty::I32, Ty::I32, Ty::I32, Ty::I32],
        &[Ty::I32],
    ),
    ("buf_prepend", &[Ty::I32, Ty::I32, Ty::I32], &[Ty::I32]),
    ("buf_slice", &[Ty::I32, Ty::I32, Ty::I32], &[Ty::I32]),
    ("buf_drop", &[Ty::I32], &[Ty::I32]),
    ("emit", &[Ty::I32], &[Ty::I32]),
    ("emit_file", &[Ty::I32, Ty::I64, Ty::I64], &[Ty::I32]),
    ("prop", &[Ty::I32, Ty::I32, Ty::I32, Ty::I32], &[Ty::I32]),
    ("log", &[Ty::I32, Ty::I32, Ty::I32], &[]),
];

fn ty_of(v: &ValType) -> Option<Ty> {
    match v {
        ValType::I32 => Some(Ty::I32),
        ValType::I64 => Some(Ty::I64),
        _ => None,
    }
}

fn sig_matches(got: impl ExactSizeIterator<Item = ValType>, want: &[Ty]) -> bool {
    got.len() == want.len() && got.zip(want).all(|(g, w)| ty_of(&g) == Some(*w))
}

fn describe(params: &[Ty], results: &[Ty]) -> String {
    format!("{params:?} -> {results:?}").to_lowercase()
}

/// Checks that `module` follows the ABI: only ferry's imports with their exact
/// signatures, the required exports with theirs, one memory no bigger than `cap` at
/// start. Returns whether `on_close` is exported.
pub(crate) fn validate(module: &Module, cap: usize) -> Result<bool, Error> {
    for imp in module.imports() {
        let what = format!("import {}::{}", imp.module(), imp.name());
        if imp.module() != IMPORT_MODULE {
            return Err(Error::BadModule(format!(
                "{what}: only `{IMPORT_MODULE}` imports"
            )));
        }
        let Some((_, params, results)) = IMPORTS.iter().find(|(n, _, _)| *n == imp.name()) else {
            return Err(Error::BadModule(format!(
                "{what}: ferry offers no such call"
            )));
        };
        let ExternType::Func(f) = imp.ty() else {
            return Err(Error::BadModule(format!("{what}: must be a function")));
        };
        if !sig_matches(f.params(), params) || !sig_matches(f.results(), results) {
            return Err(Error::BadModule(format!(
                "{what}: signature must be {}",
                describe(params, results)
            )));
        }
    }

    let mut memories = 0;
    for exp in module.exports() {
        if let ExternType::Memory(m) = exp.ty() {
            memories += 1;
            if m.is_64() || m.is_shared() {
                return Err(Error::BadModule(
                    "memory must be 32-bit and not shared".into(),
                ));
            }
            let min = m.minimum().saturating_mul(m.page_size());
            if min > cap as u64 {
                return Err(Error::BadModule(format!(
                    "memory starts at {min} bytes, more than the cap of {cap}"
                )));
            }
        }
    }
    match module.get_export(EXPORT_MEMORY) {
        Some(ExternType::Memory(_)) if memories == 1 => {}
        _ => {
            return Err(Error::BadModule(format!(
                "must export exactly one memory, named `{EXPORT_MEMORY}`"
            )));
        }
    }
    check_func(module, EXPORT_INIT, &[], true)?;
    check_func(module, EXPORT_ON_DATA, &[Ty::I32], true)?;
    check_func(module, EXPORT_ON_CLOSE, &[], false)
}

fn check_func(module: &Module, name: &str, params: &[Ty], required: bool) -> Result<bool, Error> {
    match module.get_export(name) {
        None if !required => Ok(false),
        None => Err(Error::BadModule(format!("missing export `{name}`"))),
        Some(ExternType::Func(f))
            if sig_matches(f.params(), params) && sig_matches(f.results(), &[Ty::I32]) =>
        {
            Ok(true)
        }
        Some(_) => Err(Error::BadModule(format!(
            "export `{name}` must be a function {}",
            describe(params, &[Ty::I32])
        ))),
    }
}
