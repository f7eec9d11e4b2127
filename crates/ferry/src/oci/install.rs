//! `ferry oci install --docker|--podman|--containerd`: registers ferry with an engine.
use ferry_oci::args::Invocation;

use super::OciError;

/// Not written yet: says what to write by hand.
pub(super) fn install(_inv: &Invocation) -> Result<i32, OciError> {
    Err(OciError::Runtime("install: not implemented yet".into()))
}
