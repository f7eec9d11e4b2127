//! `ferry-counters`: counters declared once. A struct of counters is written as one
//! [`counters!`] invocation: its counters are one list of `name: "label"`, and from that
//! list come the fields (`pub name: u64`), their sum ([`Counters::add`]), their text
//! (`label value, …`: `ferry run --stats`) and their JSON (`"name":value,…`:
//! `--stats-json`, `ferry ctl stats --json`). Adding a counter is adding one line to
//! the list; [`check`] tests that a struct's outputs show every counter it lists.
//!
//! It owns that mechanism, and the one row both kinds of server report live
//! ([`LiveStats`], `ferry ctl stats`), so that neither server crate needs the other for
//! it. What a counter means, and what else a struct holds or prints (ids, lists of
//! sub-counters), stay with the struct's crate. It does no I/O and keeps no state.
#![deny(unsafe_code)]

mod live;

pub use live::{LiveStats, live_json, live_table};

/// One counter of a struct, as its list declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    /// The field's name, which is also its JSON key.
    pub name: &'static str,
    /// Its words in the text output.
    pub label: &'static str,
    /// Its value.
    pub value: u64,
}

/// What [`counters!`] implements for a struct: its counters in their listed order, and
/// what is made from them.
pub trait Counters {
    /// Every counter, in the listed order.
    fn counters(&self) -> Vec<Counter>;

    /// Adds `other`'s counters to these (fields outside the list are left alone).
    fn add(&mut self, other: &Self);

    /// Sets the counter `name`; `false` when the struct lists no such counter.
    fn set(&mut self, name: &str, value: u64) -> bool;

    /// The counters as JSON members, `"name":value` joined by `,` (no braces: the
    /// struct's object adds its own members around them).
    fn json_fields(&self) -> String {
        let each: Vec<String> = self
            .counters()
            .iter()
            .map(|c| format!("\"{}\":{}", c.name, c.value))
            .collect();
        each.join(",")
    }

    /// The counters as text, `label value` joined by `, `.
    fn text_fields(&self) -> String {
        let each: Vec<String> = self
            .counters()
            .iter()
            .map(|c| format!("{} {}", c.label, c.value))
            .collect();
        each.join(", ")
    }

    /// Reads back the counters [`json_fields`](Counters::json_fields) wrote: each
    /// counter whose key is found (its first `"name":` followed by digits) is set.
    /// Returns how many were. Meant for a flat object; unknown keys are skipped.
    fn read_json(&mut self, json: &str) -> usize {
        let names: Vec<&'static str> = self.counters().iter().map(|c| c.name).collect();
        let mut found = 0;
        for name in names {
            let key = format!("\"{name}\":");
            let Some(at) = json.find(&key) else { continue };
            let rest = &json[at + key.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if let Ok(v) = rest[..end].parse() {
                found += usize::from(self.set(name, v));
            }
        }
        found
    }
}

/// Declares a struct whose counters are listed once.
///
/// ```
/// ferry_counters::counters! {
///     /// What one worker did.
///     #[derive(Clone, Debug, Default)]
///     pub struct WorkerStats {
///         /// Fields that are not counters come first, as in any struct.
///         pub id: String,
///     }
///     counters {
///         /// Jobs done.
///         jobs: "jobs",
///         /// Bytes written.
///         bytes_out: "bytes out",
///     }
/// }
/// use ferry_counters::Counters;
/// let mut a = WorkerStats { id: "w".into(), jobs: 2, bytes_out: 10 };
/// a.add(&a.clone());
/// assert_eq!(a.json_fields(), r#""jobs":4,"bytes_out":20"#);
/// assert_eq!(a.text_fields(), "jobs 4, bytes out 20");
/// assert_eq!(WorkerStats::COUNTERS, ["jobs", "bytes_out"]);
/// ```
///
/// The counters are `pub u64` fields after the others; their doc comments go on the
/// fields. [`Counters`] is implemented from the list, and `COUNTERS` names them.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $fty:ty ),* $(,)?
        }
        counters {
            $( $(#[$cmeta:meta])* $counter:ident : $label:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $fty, )*
            $( $(#[$cmeta])* pub $counter: u64, )*
        }

        impl $name {
            /// The counters' names (their JSON keys), in the listed order.
            pub const COUNTERS: &'static [&'static str] = &[$(stringify!($counter)),*];
        }

        impl $crate::Counters for $name {
            fn counters(&self) -> ::std::vec::Vec<$crate::Counter> {
                ::std::vec![$($crate::Counter {
                    name: stringify!($counter),
                    label: $label,
                    value: self.$counter,
                }),*]
            }

            fn add(&mut self, other: &Self) {
                $( self.$counter += other.$counter; )*
            }

            fn set(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $( stringify!($counter) => self.$counter = value, )*
                    _ => return false,
                }
                true
            }
        }
    };
}

/// Checks a struct's counters as its tests should: each listed counter is set to a
/// value of its own, then must appear once and in order in [`Counters::counters`], as
/// `"name":value` in `json` and as `label value` in `text` (the struct's own outputs,
/// made by `show` from the filled struct), survive a JSON round trip and be summed by
/// [`Counters::add`]. Names and labels must be distinct. Panics, saying which counter,
/// otherwise.
pub fn check<C: Counters + Default>(names: &[&str], show: impl Fn(&C) -> (String, String)) {
    let mut a = C::default();
    for (i, name) in names.iter().enumerate() {
        assert!(a.set(name, 1000 + i as u64), "`{name}` is not settable");
    }
    let listed = a.counters();
    let listed_names: Vec<&str> = listed.iter().map(|c| c.name).collect();
    assert_eq!(listed_names, names, "counters() lists them in order");
    let mut labels: Vec<&str> = listed.iter().map(|c| c.label).collect();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), listed.len(), "labels are distinct");
    let (json, text) = show(&a);
    for c in &listed {
        let member = format!("\"{}\":{}", c.name, c.value);
        assert_eq!(json.matches(&member).count(), 1, "{member} once in {json}");
        let words = format!("{} {}", c.label, c.value);
        assert!(text.contains(&words), "`{words}` in {text}");
    }
    let mut back = C::default();
    assert_eq!(back.read_json(&json), names.len(), "read back from {json}");
    assert_eq!(back.counters(), listed, "JSON round trip");
    back.add(&a);
    for (c, sum) in listed.iter().zip(back.counters()) {
        assert_eq!(sum.value, 2 * c.value, "{} is summed", c.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    counters! {
        /// A struct as the servers declare theirs.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Sample {
            /// Not a counter: kept by `add`, absent from the outputs.
            pub id: u32,
        }
        counters {
            /// A first counter.
            requests: "requests",
            /// A second.
            bytes_out: "bytes out",
            /// A name that ends another's ("out"), to catch a sloppy key search.
            out: "out",
        }
    }

    fn show(s: &Sample) -> (String, String) {
        (
            format!("{{\"id\":{},{}}}", s.id, s.json_fields()),
            format!("sample {}: {}", s.id, s.text_fields()),
        )
    }

    #[test]
    fn one_list_makes_fields_sum_text_and_json() {
        let mut a = Sample {
            id: 7,
            requests: 1,
            bytes_out: 20,
            out: 3,
        };
        assert_eq!(Sample::COUNTERS, ["requests", "bytes_out", "out"]);
        assert_eq!(a.json_fields(), r#""requests":1,"bytes_out":20,"out":3"#);
        assert_eq!(a.text_fields(), "requests 1, bytes out 20, out 3");
        a.add(&Sample {
            id: 9,
            requests: 2,
            bytes_out: 5,
            out: 1,
        });
        assert_eq!((a.id, a.requests, a.bytes_out, a.out), (7, 3, 25, 4));
        assert!(!a.set("id", 1), "only listed counters are set");
        check::<Sample>(Sample::COUNTERS, show);
    }

    #[test]
    fn read_json_takes_exact_keys() {
        let mut s = Sample::default();
        let n = s.read_json(r#"{"id":4,"bytes_out":20,"out":3,"other":9}"#);
        assert_eq!(n, 2);
        assert_eq!((s.id, s.requests, s.bytes_out, s.out), (0, 0, 20, 3));
    }

    /// The check catches an output that leaves a counter out (as `--stats`' text once
    /// left out the modules' times).
    #[test]
    #[should_panic(expected = "bytes out 1001")]
    fn check_finds_a_counter_missing_from_the_text() {
        check::<Sample>(Sample::COUNTERS, |s| {
            (
                format!("{{{}}}", s.json_fields()),
                format!("requests {}, out {}", s.requests, s.out),
            )
        });
    }
}
