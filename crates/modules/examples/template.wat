;; template: a content transformer. Replaces every `{{name}}` in the input with the
;; value of property `name` (left as it is when there is no such property), streaming:
;; a placeholder may be split across input buffers.
;;
;; Properties:
;;   http          (optional) if present, the output is an HTTP/1.1 200 response with
;;                 Transfer-Encoding: chunked (each output buffer becomes a chunk: the
;;                 chunk-size line is put in front with buf_prepend, the CRLF after it
;;                 with buf_write; on_close sends the last chunk)
;;   content-type  (optional, with http) default text/plain
;;   any other     values for placeholders (values longer than 32 KiB are cut)
;; Names are at most 64 bytes; a longer `{{...` is passed through as text.
;;
;; Memory map:
;;   0x0000  strings        0x1000  name being read (64)     0x1100  chunk-size line
;;   0x2000  header         0x10000 input (16 KiB)           0x20000 output (64 KiB)
(module
  (import "ferry" "prop" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_len" (func $buf_len (param i32) (result i32)))
  (import "ferry" "buf_read" (func $buf_read (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_new" (func $buf_new (param i32 i32) (result i32)))
  (import "ferry" "buf_write" (func $buf_write (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_prepend" (func $buf_prepend (param i32 i32 i32) (result i32)))
  (import "ferry" "buf_drop" (func $buf_drop (param i32) (result i32)))
  (import "ferry" "emit" (func $emit (param i32) (result i32)))

  (memory (export "memory") 3)

  (data (i32.const 0x0000) "http")                                             ;; 4
  (data (i32.const 0x0010) "content-type")                                     ;; 12
  (data (i32.const 0x0020) "HTTP/1.1 200 OK\0d\0aTransfer-Encoding: chunked\0d\0aContent-Type: ") ;; 59
  (data (i32.const 0x0060) "text/plain")                                       ;; 10
  (data (i32.const 0x0070) "\0d\0a\0d\0a")                                        ;; 4
  (data (i32.const 0x0080) "0\0d\0a\0d\0a")                                       ;; 5
  (data (i32.const 0x0090) "0123456789abcdef")                                 ;; 16
  (data (i32.const 0x00a0) "{{}}")                                             ;; 4

  (global $NAME i32 (i32.const 0x1000))
  (global $NAME_MAX i32 (i32.const 64))
  (global $LINE i32 (i32.const 0x1100))
  (global $HDR i32 (i32.const 0x2000))
  (global $IN i32 (i32.const 0x10000))
  (global $IN_MAX i32 (i32.const 0x4000))
  (global $OUT i32 (i32.const 0x20000))
  (global $OUT_END i32 (i32.const 0x30000))
  (global $VALUE_MAX i32 (i32.const 0x8000))

  (global $http (mut i32) (i32.const 0))
  ;; 0 text, 1 after '{', 2 in a name, 3 after '}' in a name
  (global $state (mut i32) (i32.const 0))
  (global $nlen (mut i32) (i32.const 0))
  (global $out (mut i32) (i32.const 0x20000))
  (global $err (mut i32) (i32.const 0))

  ;; Emits the output area (as a chunk with http); records a failure in $err.
  (func $flush
    (local $h i32) (local $len i32) (local $p i32) (local $r i32)
    (local.set $len (i32.sub (global.get $out) (global.get $OUT)))
    (if (i32.eqz (local.get $len)) (then (return)))
    (local.set $h (call $buf_new (global.get $OUT) (local.get $len)))
    (if (i32.lt_s (local.get $h) (i32.const 0)) (then (global.set $err (local.get $h)) (return)))
    (global.set $out (global.get $OUT))
    (if (global.get $http)
      (then
        ;; "<hex len>\r\n" in front, written backwards from the end of $LINE
        (local.set $p (i32.add (global.get $LINE) (i32.const 16)))
        (i32.store16 (local.get $p) (i32.const 0x0a0d))
        (loop $hex
          (local.set $p (i32.sub (local.get $p) (i32.const 1)))
          (i32.store8 (local.get $p)
            (i32.load8_u (i32.add (i32.const 0x0090) (i32.and (local.get $len) (i32.const 15)))))
          (local.set $len (i32.shr_u (local.get $len) (i32.const 4)))
          (br_if $hex (local.get $len)))
        (local.set $r (call $buf_prepend (local.get $h) (local.get $p)
                        (i32.sub (i32.add (global.get $LINE) (i32.const 18)) (local.get $p))))
        (if (i32.lt_s (local.get $r) (i32.const 0)) (then (global.set $err (local.get $r)) (return)))
        ;; "\r\n" after
        (local.set $r (call $buf_write (local.get $h) (call $buf_len (local.get $h))
                        (i32.add (global.get $LINE) (i32.const 16)) (i32.const 2)))
        (if (i32.lt_s (local.get $r) (i32.const 0)) (then (global.set $err (local.get $r)) (return)))))
    (drop (call $emit (local.get $h))))

  (func $put (param $c i32)
    (i32.store8 (global.get $out) (local.get $c))
    (global.set $out (i32.add (global.get $out) (i32.const 1)))
    (if (i32.ge_u (global.get $out) (global.get $OUT_END)) (then (call $flush))))

  (func $put_bytes (param $p i32) (param $n i32)
    (block $done
      (loop $l
        (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
        (call $put (i32.load8_u (local.get $p)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $l))))

  ;; Writes back what was held since the last text: "{", "{{name" or "{{name}".
  (func $unhold
    (if (i32.ge_u (global.get $state) (i32.const 1)) (then (call $put (i32.const 0x7b))))
    (if (i32.ge_u (global.get $state) (i32.const 2))
      (then (call $put (i32.const 0x7b)) (call $put_bytes (global.get $NAME) (global.get $nlen))))
    (if (i32.eq (global.get $state) (i32.const 3)) (then (call $put (i32.const 0x7d))))
    (global.set $state (i32.const 0)))

  ;; The value of the name just read, or the placeholder itself.
  (func $substitute
    (local $n i32) (local $room i32)
    (local.set $room (i32.sub (global.get $OUT_END) (global.get $out)))
    (local.set $n (call $prop (global.get $NAME) (global.get $nlen) (global.get $out) (local.get $room)))
    (if (i32.lt_s (local.get $n) (i32.const 0))
      (then
        (call $put_bytes (i32.const 0x00a0) (i32.const 2))
        (call $put_bytes (global.get $NAME) (global.get $nlen))
        (call $put_bytes (i32.const 0x00a2) (i32.const 2))
        (return)))
    (if (i32.gt_u (local.get $n) (local.get $room))
      (then
        ;; did not fit: flush and read it again into the empty area
        (call $flush)
        (local.set $n (call $prop (global.get $NAME) (global.get $nlen) (global.get $out) (global.get $VALUE_MAX)))
        (if (i32.gt_u (local.get $n) (global.get $VALUE_MAX)) (then (local.set $n (global.get $VALUE_MAX))))))
    (global.set $out (i32.add (global.get $out) (local.get $n)))
    (if (i32.ge_u (global.get $out) (global.get $OUT_END)) (then (call $flush))))

  (func $byte (param $c i32)
    (local $s i32)
    (local.set $s (global.get $state))
    (if (i32.eqz (local.get $s))
      (then
        (if (i32.eq (local.get $c) (i32.const 0x7b))
          (then (global.set $state (i32.const 1)))
          (else (call $put (local.get $c))))
        (return)))
    (if (i32.eq (local.get $s) (i32.const 1))
      (then
        (if (i32.eq (local.get $c) (i32.const 0x7b))
          (then (global.set $state (i32.const 2)) (global.set $nlen (i32.const 0)))
          (else (call $unhold) (call $byte (local.get $c))))
        (return)))
    (if (i32.eq (local.get $s) (i32.const 2))
      (then
        (if (i32.eq (local.get $c) (i32.const 0x7d))
          (then (global.set $state (i32.const 3)) (return)))
        (if (i32.ge_u (global.get $nlen) (global.get $NAME_MAX))
          (then (call $unhold) (call $byte (local.get $c)) (return)))
        (i32.store8 (i32.add (global.get $NAME) (global.get $nlen)) (local.get $c))
        (global.set $nlen (i32.add (global.get $nlen) (i32.const 1)))
        (return)))
    ;; state 3
    (if (i32.eq (local.get $c) (i32.const 0x7d))
      (then (call $substitute) (global.set $state (i32.const 0)))
      (else (call $unhold) (call $byte (local.get $c)))))

  (func (export "init") (result i32)
    (local $p i32) (local $n i32) (local $h i32)
    (if (i32.lt_s (call $prop (i32.const 0) (i32.const 4) (i32.const 0) (i32.const 0)) (i32.const 0))
      (then (return (i32.const 0))))
    (global.set $http (i32.const 1))
    (local.set $p (global.get $HDR))
    (memory.copy (local.get $p) (i32.const 0x0020) (i32.const 59))
    (local.set $p (i32.add (local.get $p) (i32.const 59)))
    (local.set $n (call $prop (i32.const 0x0010) (i32.const 12) (local.get $p) (i32.const 1024)))
    (if (i32.lt_s (local.get $n) (i32.const 0))
      (then (memory.copy (local.get $p) (i32.const 0x0060) (i32.const 10)) (local.set $n (i32.const 10))))
    (if (i32.gt_s (local.get $n) (i32.const 1024)) (then (return (i32.const -1))))
    (local.set $p (i32.add (local.get $p) (local.get $n)))
    (memory.copy (local.get $p) (i32.const 0x0070) (i32.const 4))
    (local.set $p (i32.add (local.get $p) (i32.const 4)))
    (local.set $h (call $buf_new (global.get $HDR) (i32.sub (local.get $p) (global.get $HDR))))
    (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
    (drop (call $emit (local.get $h)))
    (i32.const 0))

  (func (export "on_data") (param $h i32) (result i32)
    (local $off i32) (local $n i32) (local $p i32) (local $end i32)
    (block $done
      (loop $chunk
        (local.set $n (call $buf_read (local.get $h) (local.get $off) (global.get $IN) (global.get $IN_MAX)))
        (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
        (local.set $p (global.get $IN))
        (local.set $end (i32.add (global.get $IN) (local.get $n)))
        (block $bytes_done
          (loop $bytes
            (br_if $bytes_done (i32.ge_u (local.get $p) (local.get $end)))
            (call $byte (i32.load8_u (local.get $p)))
            (local.set $p (i32.add (local.get $p) (i32.const 1)))
            (br $bytes)))
        (local.set $off (i32.add (local.get $off) (local.get $n)))
        (br $chunk)))
    (drop (call $buf_drop (local.get $h)))
    (call $flush)
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (return (local.get $n))))
    (global.get $err))

  (func (export "on_close") (result i32)
    (local $h i32)
    (call $unhold)
    (call $flush)
    (if (global.get $err) (then (return (global.get $err))))
    (if (global.get $http)
      (then
        (local.set $h (call $buf_new (i32.const 0x0080) (i32.const 5)))
        (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
        (drop (call $emit (local.get $h)))))
    (i32.const 1))
)
