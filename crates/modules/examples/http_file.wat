;; http_file: S3's example. An HTTP/1.1 200 response: the status line and headers are
;; built here, the body is file 0 sent by the server with sendfile — the file's bytes
;; never enter this module's memory.
;;
;; Properties:
;;   content-length  (required) decimal length of the body = bytes of file 0 to send
;;   content-type    (optional) default application/octet-stream
;;   mode            (optional) "once" (default) or "lines"
;; Files: 0 = the body.
;; mode once: init emits the header and the file range, then returns 1 (finished): the
;; module takes no input.
;; mode lines (a kept-alive connection, bound once): init only builds the header; every
;; newline the program sends (one line per request it got, e.g. its request line) is
;; answered with the header and the file range. The lines themselves are not sent.
(module
  (import "ferry" "prop" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_new" (func $buf_new (param i32 i32) (result i32)))
  (import "ferry" "buf_drop" (func $buf_drop (param i32) (result i32)))
  (import "ferry" "buf_read" (func $buf_read (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "emit" (func $emit (param i32) (result i32)))
  (import "ferry" "emit_file" (func $emit_file (param i32 i64 i64) (result i32)))
  (import "ferry" "log" (func $log (param i32 i32 i32)))

  (memory (export "memory") 1)

  (data (i32.const 0) "content-length")                          ;; 14 bytes
  (data (i32.const 16) "content-type")                           ;; 12 bytes
  (data (i32.const 32) "HTTP/1.1 200 OK\0d\0aContent-Length: ")    ;; 33 bytes
  (data (i32.const 80) "\0d\0aContent-Type: ")                     ;; 16 bytes
  (data (i32.const 112) "\0d\0a\0d\0a")                             ;; 4 bytes
  (data (i32.const 128) "application/octet-stream")              ;; 24 bytes
  (data (i32.const 160) "http_file: content-length missing or not a number") ;; 49
  (data (i32.const 224) "http_file: content-type too long")     ;; 32
  (data (i32.const 256) "mode")                                  ;; 4
  (data (i32.const 264) "lines")                                 ;; 5
  (data (i32.const 272) "http_file: mode is once or lines")     ;; 32

  ;; The header is assembled at 1024.
  (global $HDR i32 (i32.const 1024))
  (global $TYPE_MAX i32 (i32.const 1024))
  ;; The mode's value is read at 2304, input is scanned at 4096.
  (global $MODE i32 (i32.const 2304))
  (global $SCAN i32 (i32.const 4096))
  (global $SCAN_LEN i32 (i32.const 1024))
  ;; Built by init: the header's length, the body's length, mode lines.
  (global $hdr_len (mut i32) (i32.const 0))
  (global $len (mut i64) (i64.const 0))
  (global $lines (mut i32) (i32.const 0))

  (func $fail (param $msg i32) (param $len i32) (result i32)
    (call $log (i32.const 0) (local.get $msg) (local.get $len))
    (i32.const -1))

  (func (export "init") (result i32)
    (local $p i32) (local $n i32) (local $i i32) (local $c i32) (local $len i64)
    ;; "HTTP/1.1 200 OK\r\nContent-Length: "
    (memory.copy (global.get $HDR) (i32.const 32) (i32.const 33))
    (local.set $p (i32.add (global.get $HDR) (i32.const 33)))
    ;; The length's digits go straight into the header; parse them in place.
    (local.set $n (call $prop (i32.const 0) (i32.const 14) (local.get $p) (i32.const 19)))
    (if (i32.or (i32.lt_s (local.get $n) (i32.const 1)) (i32.gt_s (local.get $n) (i32.const 18)))
      (then (return (call $fail (i32.const 160) (i32.const 49)))))
    (block $done
      (loop $digits
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.sub (i32.load8_u (i32.add (local.get $p) (local.get $i))) (i32.const 48)))
        (if (i32.gt_u (local.get $c) (i32.const 9))
          (then (return (call $fail (i32.const 160) (i32.const 49)))))
        (local.set $len (i64.add (i64.mul (local.get $len) (i64.const 10))
                                 (i64.extend_i32_u (local.get $c))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $digits)))
    (local.set $p (i32.add (local.get $p) (local.get $n)))
    ;; "\r\nContent-Type: " + the type
    (memory.copy (local.get $p) (i32.const 80) (i32.const 16))
    (local.set $p (i32.add (local.get $p) (i32.const 16)))
    (local.set $n (call $prop (i32.const 16) (i32.const 12) (local.get $p) (global.get $TYPE_MAX)))
    (if (i32.lt_s (local.get $n) (i32.const 0))
      (then
        (memory.copy (local.get $p) (i32.const 128) (i32.const 24))
        (local.set $n (i32.const 24))))
    (if (i32.gt_s (local.get $n) (global.get $TYPE_MAX))
      (then (return (call $fail (i32.const 224) (i32.const 32)))))
    (local.set $p (i32.add (local.get $p) (local.get $n)))
    ;; "\r\n\r\n"
    (memory.copy (local.get $p) (i32.const 112) (i32.const 4))
    (local.set $p (i32.add (local.get $p) (i32.const 4)))
;; "once", or no mode: answer now; "lines": wait for the program's lines.
    (global.set $hdr_len (i32.sub (local.get $p) (global.get $HDR)))
    (global.set $len (local.get $len))
    (local.set $n (call $prop (i32.const 256) (i32.const 4) (global.get $MODE) (i32.const 8)))
    (if (i32.eq (local.get $n) (i32.const 5))
      (then
        (if (i32.and
              (i32.eq (i32.load (global.get $MODE)) (i32.load (i32.const 264)))
              (i32.eq (i32.load8_u (i32.add (global.get $MODE) (i32.const 4)))
                      (i32.load8_u (i32.const 268))))
          (then
            (global.set $lines (i32.const 1))
            (return (i32.const 0))))))
    (if (i32.and (i32.ge_s (local.get $n) (i32.const 0))
                 (i32.or (i32.ne (local.get $n) (i32.const 4))
                         (i32.ne (i32.load (global.get $MODE)) (i32.const 0x65636e6f)))) ;; "once"
      (then (return (call $fail (i32.const 272) (i32.const 32)))))
    (local.set $n (call $respond))
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (return (local.get $n))))
    (i32.const 1))

  ;; The header (a copy: emitting consumes the buffer), then the whole file by reference.
  (func $respond (result i32)
    (local $h i32) (local $n i32)
    (local.set $h (call $buf_new (global.get $HDR) (global.get $hdr_len)))
    (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
    (drop (call $emit (local.get $h)))
    (local.set $n (call $emit_file (i32.const 0) (i64.const 0) (global.get $len)))
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (return (local.get $n))))
    (i32.const 0))

  ;; Mode once: nothing is expected; anything fed is dropped. Mode lines: one response
  ;; per newline in the input.
  (func (export "on_data") (param $h i32) (result i32)
    (local $off i32) (local $k i32) (local $i i32) (local $r i32)
    (block $end
      (br_if $end (i32.eqz (global.get $lines)))
      (loop $more
        (local.set $k (call $buf_read (local.get $h) (local.get $off)
                                      (global.get $SCAN) (global.get $SCAN_LEN)))
        (br_if $end (i32.le_s (local.get $k) (i32.const 0)))
        (local.set $i (i32.const 0))
        (block $scanned
          (loop $scan
            (br_if $scanned (i32.ge_u (local.get $i) (local.get $k)))
            (if (i32.eq (i32.load8_u (i32.add (global.get $SCAN) (local.get $i))) (i32.const 10))
              (then
                (local.set $r (call $respond))
                (if (i32.lt_s (local.get $r) (i32.const 0))
                  (then
                    (drop (call $buf_drop (local.get $h)))
                    (return (local.get $r))))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $scan)))
        (local.set $off (i32.add (local.get $off) (local.get $k)))
        (br $more)))
    (drop (call $buf_drop (local.get $h)))
    (i32.const 0))
)
