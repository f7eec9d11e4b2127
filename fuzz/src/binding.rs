//! Target `binding`: a module binding (`FMB2`, [`Binding::decode`]) as the server reads
//! it from a channel buffer, a control packet or a memfd.
//!
//! Properties checked: decoding never panics; a decoded binding is within every limit
//! of `ferry_proto` and encodes back to exactly the input bytes (the format has one
//! encoding per binding, so nothing is ignored or read twice).

use ferry_proto::{
    Binding, MAX_FILE_HANDLES, MAX_KEY_BYTES, MAX_MODULE_BYTES, MAX_PROPS, MAX_VALUE_BYTES,
    ModuleRef,
};

/// One input.
pub fn run(data: &[u8]) {
    let b = match Binding::decode(data) {
        Ok(b) => b,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    if let ModuleRef::Bytes(m) = b.module {
        assert!((1..=MAX_MODULE_BYTES).contains(&m.len()));
    }
    assert!(b.props.len() <= MAX_PROPS);
    for (k, v) in &b.props {
        assert!((1..=MAX_KEY_BYTES).contains(&k.len()));
        assert!(v.len() <= MAX_VALUE_BYTES);
    }
    assert!(b.handles.len() <= MAX_FILE_HANDLES);
    assert_eq!(
        b.encode(),
        data,
        "the binding does not encode back to its bytes"
    );
}
